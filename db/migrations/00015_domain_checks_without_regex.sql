-- +goose Up
-- The label and digest domains (00013) checked their values with regular
-- expressions. Postgres evaluates a domain's CHECK for every value bound
-- to a parameter of the domain's type and every value written, and its
-- regular expressions cost 2 to 13 µs each (a cache lookup, the text
-- turned into wide characters, the automaton): about 80 µs of Postgres'
-- CPU per upload, 3 % of all the CPU of a loaded bench
-- (docs/performance.md, item 26). These checks accept exactly the same
-- values (TestDomainChecksMatchTheirRegularExpressions compares them on
-- edge cases and random strings) with string functions: the length in
-- bytes, ltrim(VALUE, <allowed characters>) = '' (every character is an
-- allowed one, so they are ASCII and the byte length is the length), and
-- the first and last characters. Same names, same check_violation.
-- object_location keeps its [[:cntrl:]] test, which depends on the
-- database's locale for characters beyond ASCII.
ALTER DOMAIN sha256_digest DROP CONSTRAINT sha256_digest_canonical;
ALTER DOMAIN sha256_digest ADD CONSTRAINT sha256_digest_canonical CHECK (
    octet_length(VALUE) = 71 AND starts_with(VALUE, 'sha256:')
    AND ltrim(substr(VALUE, 8), '0123456789abcdef') = '');

ALTER DOMAIN principal_name DROP CONSTRAINT principal_name_shape;
ALTER DOMAIN principal_name ADD CONSTRAINT principal_name_shape CHECK (
    octet_length(VALUE) BETWEEN 1 AND 128
    AND ltrim(VALUE, 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._@:-') = ''
    AND strpos('._@:-', left(VALUE, 1)) = 0);

ALTER DOMAIN dc_label DROP CONSTRAINT dc_label_shape;
ALTER DOMAIN dc_label ADD CONSTRAINT dc_label_shape CHECK (
    octet_length(VALUE) BETWEEN 1 AND 63
    AND ltrim(VALUE, 'abcdefghijklmnopqrstuvwxyz0123456789-') = ''
    AND left(VALUE, 1) <> '-' AND right(VALUE, 1) <> '-');

ALTER DOMAIN backend_label DROP CONSTRAINT backend_label_shape;
ALTER DOMAIN backend_label ADD CONSTRAINT backend_label_shape CHECK (
    octet_length(VALUE) BETWEEN 1 AND 32
    AND ltrim(VALUE, 'abcdefghijklmnopqrstuvwxyz0123456789_-') = ''
    AND strpos('_-', left(VALUE, 1)) = 0);

-- +goose Down
ALTER DOMAIN sha256_digest DROP CONSTRAINT sha256_digest_canonical;
ALTER DOMAIN sha256_digest ADD CONSTRAINT sha256_digest_canonical CHECK (VALUE ~ '^sha256:[0-9a-f]{64}$');
ALTER DOMAIN principal_name DROP CONSTRAINT principal_name_shape;
ALTER DOMAIN principal_name ADD CONSTRAINT principal_name_shape CHECK (VALUE ~ '^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$');
ALTER DOMAIN dc_label DROP CONSTRAINT dc_label_shape;
ALTER DOMAIN dc_label ADD CONSTRAINT dc_label_shape CHECK (VALUE ~ '^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$');
ALTER DOMAIN backend_label DROP CONSTRAINT backend_label_shape;
ALTER DOMAIN backend_label ADD CONSTRAINT backend_label_shape CHECK (VALUE ~ '^[a-z0-9][a-z0-9_-]{0,31}$');
