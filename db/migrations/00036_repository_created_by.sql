-- +goose Up
-- A push creates its repository (issue 31): the first write by a
-- principal whose grant covers a name that does not exist yet creates it,
-- recorded here (who; created_at says when). An admin's creation records
-- its operator.
ALTER TABLE repositories ADD COLUMN created_by text NOT NULL DEFAULT 'admin' CHECK (created_by <> '');
COMMENT ON COLUMN repositories.created_by IS 'Who created it: the principal whose first push did (its grant covered the name), or the operator of api repo create / POST /v1/admin/repositories (admin).';

-- +goose Down
ALTER TABLE repositories DROP COLUMN created_by;
