-- name: ReleaseLease :execrows
-- A clean stop gives the lease up under its epoch fence so a successor can
-- ACQUIRE at once instead of waiting out the TTL. The epoch is untouched
-- (R16): the successor's claim increments it.
UPDATE leases SET expires_at = now()
WHERE partition_id = @partition_id AND epoch = @epoch AND owner_node = @node AND expires_at > now();
