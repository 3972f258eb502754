-- +goose Up
-- The replication policy (issue 28, docs/replication.md): which
-- datacenters must hold a verified copy of what a repository publishes,
-- and how many verified copies it needs at least. One row per repository
-- prefix: '' is the global default, 'team/' every repository under team/
-- (at any depth, not team itself nor teamx/...), 'team/app' that one
-- repository. The row of the longest prefix matching a repository is its
-- policy; with no row the api's BLOBPLANE_REPLICATE_TO applies.
-- Publication reads it in the publishing statement (Publish, PublishMany,
-- through replication_targets below) and enqueues a replicate job for
-- each required datacenter other than the ingress.
--
-- Every rule is checked here as well as in Go (package replication/policy),
-- so a DBA's hand-written row obeys the same rules.

-- policy_datacenters_ascending reports whether labels is in strictly
-- ascending byte order (so: no label twice, one spelling per set) and
-- holds no NULL. A function, because a CHECK may not hold a subquery.
-- +goose StatementBegin
CREATE FUNCTION policy_datacenters_ascending(labels text[]) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT array_position(labels, NULL) IS NULL
       AND NOT EXISTS (
           SELECT 1 FROM generate_subscripts(labels, 1) AS i
           WHERE i > array_lower(labels, 1) AND NOT (labels[i - 1] COLLATE "C" < labels[i] COLLATE "C"))
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION policy_datacenters_ascending(text[]) IS 'Whether labels is in strictly ascending byte order (no duplicates) without NULLs: replication_policies.datacenters'' shape.';

CREATE TABLE replication_policies (
    prefix               text        PRIMARY KEY CHECK (
                             prefix = ''
                             OR (length(prefix) <= 255
                                 AND prefix ~ '^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*)*/?$')),
    datacenters          dc_label[]  NOT NULL CHECK (
                             cardinality(datacenters) <= 64
                             AND coalesce(array_ndims(datacenters), 1) = 1
                             AND policy_datacenters_ascending(datacenters::text[])),
    min_verified_copies  integer     NOT NULL CHECK (min_verified_copies >= 1),
    set_by               principal_name NOT NULL,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- The copies a policy guarantees are its datacenters' (the ingress's
    -- among them or not), or the ingress's alone when it names none: a
    -- minimum above that could never be met.
    CONSTRAINT replication_policies_min_reachable CHECK (min_verified_copies <= greatest(cardinality(datacenters), 1))
);

COMMENT ON TABLE replication_policies IS 'Replication policy per repository prefix (issue 28, docs/replication.md): the longest prefix matching a repository decides which datacenters must hold a verified copy of what it publishes. No matching row: the api''s BLOBPLANE_REPLICATE_TO.';
COMMENT ON COLUMN replication_policies.prefix IS 'Repositories governed: '''' every repository (the global default); a repository name followed by / (team/) every repository under it, at any depth; a repository name (team/app) that repository only. The longest matching prefix wins.';
COMMENT ON COLUMN replication_policies.datacenters IS 'Datacenters that must hold a verified copy, in ascending order, no duplicates; may be empty (no replication: the ingress copy only). A publication enqueues a replicate job for each of them but its ingress.';
COMMENT ON COLUMN replication_policies.min_verified_copies IS 'Verified copies (in distinct datacenters, the ingress''s counted) a digest needs at least to meet the policy: 1 to max(number of datacenters, 1).';
COMMENT ON COLUMN replication_policies.set_by IS 'Principal that last set the policy (the admin API''s caller, or the CLI''s --by).';
COMMENT ON COLUMN replication_policies.created_at IS 'Database time the prefix first got a policy.';
COMMENT ON COLUMN replication_policies.updated_at IS 'Database time of the last change.';

-- The matching rule and the targets of a publication, spelt once for
-- every statement that needs them (PolicyFor, Publish, PublishMany).
-- Both are SQL functions returning a set, STABLE and not STRICT, so the
-- planner inlines them into the calling statement (its plan shows the
-- tables, not a function scan): no planning of a function body per call
-- on the publishing hot path.
-- +goose StatementBegin
CREATE FUNCTION replication_policy_of(repository text) RETURNS SETOF replication_policies
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT * FROM replication_policies rp
    WHERE rp.prefix = '' OR rp.prefix = repository
       OR (right(rp.prefix, 1) = '/' AND starts_with(repository, rp.prefix))
    ORDER BY length(rp.prefix) DESC
    LIMIT 1
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION replication_policy_of(text) IS 'The replication policy of a repository: the row of the longest prefix matching it ('''' every repository; team/ every repository starting with it; team/app itself). No row: none matches. Go twin: policy.For.';

-- +goose StatementBegin
CREATE FUNCTION replication_targets(repository text, ingress text, fallback text[]) RETURNS SETOF text[]
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(
        (SELECT ARRAY(SELECT d FROM unnest(p.datacenters::text[]) AS d WHERE d <> ingress)::text[]
         FROM replication_policy_of(repository) AS p),
        fallback,
        ARRAY(SELECT DISTINCT n.datacenter::text FROM nodes n WHERE n.datacenter <> ingress ORDER BY 1)::text[])
$$;
-- +goose StatementEnd

COMMENT ON FUNCTION replication_targets(text, text, text[]) IS 'The datacenters a publication in repository at ingress enqueues a replicate job for (one row): its replication policy''s datacenters other than the ingress; with no policy, fallback (BLOBPLANE_REPLICATE_TO); with neither, every registered datacenter other than the ingress.';

-- +goose Down
DROP FUNCTION replication_targets(text, text, text[]);
DROP FUNCTION replication_policy_of(text);
DROP TABLE replication_policies;
DROP FUNCTION policy_datacenters_ascending(text[]);
