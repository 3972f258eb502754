package store

import (
	"context"
	"fmt"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/store/internal/dbsqlc"
	"github.com/blobplane/blobplane/upload"
)

// ReferencedBlob answers existence for HEAD from Postgres alone: the size
// of d when repository references it, it is live, and a verified copy of
// it exists somewhere or one is being made. Errors: not_found otherwise.
//
// With the existence cache running (StartCaches; the API does), a found
// answer is cached and served without a query until a committed reference
// deletion or blob state change anywhere notifies RefsChannel (at once
// after DeleteReference through this Store), or the TTL passes. Not found
// and errors are never cached. Under Fresh, the cache is not asked.
func (s *Store) ReferencedBlob(ctx context.Context, repository string, d blobplane.Digest) (int64, error) {
	cache := s.existenceCache.Load()
	size, hit, ticket := cache.lookup(repository, d) // the ticket is taken before the query: see notifycache.Cache
	if hit && !isFresh(ctx) {
		return size, nil
	}
	// The query asks the ledger for a copy: it must exist (a no-op
	// after this Store's first placement write).
	if err := s.ensurePlacements(ctx); err != nil {
		return 0, err
	}
	row, err := s.q.GetReferencedBlob(ctx, s.pool, dbsqlc.GetReferencedBlobParams{Repository: repository, Digest: string(d)})
	if err != nil {
		return 0, dbErr("referenced blob", err)
	}
	cache.insert(ticket, repository, d, row.SizeBytes)
	return row.SizeBytes, nil
}

// DeleteReference removes repository's reference to d (not the bytes, not
// the blob state row). Errors: not_found when there is none.
func (s *Store) DeleteReference(ctx context.Context, repository string, d blobplane.Digest) error {
	n, err := s.q.DeleteReference(ctx, s.pool, dbsqlc.DeleteReferenceParams{Repository: repository, Digest: string(d)})
	if err != nil {
		// Unknown outcome: the deletion may have committed.
		s.invalidateExistenceCache()
		return dbErr("delete reference", err)
	}
	if n == 0 {
		// Nothing removed, nothing to forget: a DELETE of a reference one
		// does not have must not empty every api's existence cache (issue
		// 26 point 12; the statement's trigger notifies only for rows it
		// deleted).
		return &blobplane.Error{Code: blobplane.CodeNotFound, Op: "delete reference", Message: "blob unknown to repository"}
	}
	s.invalidateExistenceCache() // this process's next HEAD sees it without waiting for the notification
	return nil
}

// DeleteReferenceAtHome is DeleteReference at the repository's home,
// fenced by its lease as a publication is (ZBP-5 R19, R20): it deletes
// only while node holds partition's lease at epoch, and a takeover waits
// for it. Errors: stale_epoch (retryable) when the lease moved; not_found
// when there is no reference.
func (s *Store) DeleteReferenceAtHome(ctx context.Context, h upload.Home, repository string, d blobplane.Digest) error {
	const op = "delete reference"
	row, err := s.q.DeleteReferenceUnderLease(ctx, s.pool, dbsqlc.DeleteReferenceUnderLeaseParams{
		PartitionID: h.Partition, Node: h.Node, Epoch: int64(h.Epoch), Repository: repository, Digest: string(d),
	})
	if err != nil {
		s.invalidateExistenceCache() // unknown outcome: the deletion may have committed
		return dbErr(op, err)
	}
	if !row.Fenced {
		return &blobplane.Error{Code: blobplane.CodeStaleEpoch, Op: op, Retryable: true,
			Message: fmt.Sprintf("the lease of partition %s moved past epoch %d: this node is no longer the home of %s", h.Partition, h.Epoch, repository)}
	}
	if row.Deleted == 0 {
		return &blobplane.Error{Code: blobplane.CodeNotFound, Op: op, Message: "blob unknown to repository"}
	}
	s.invalidateExistenceCache()
	return nil
}
