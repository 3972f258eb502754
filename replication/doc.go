// Package replication copies published blobs between datacenters under
// the placement ledger's rules (../shared/spec/blob-placement.md; DESIGN
// flow 3, S2, S3). A Transfer stages a pending placement at the target
// under a new epoch, streams the bytes from a verified source (this
// datacenter's backends, or a node of another datacenter), writes them
// through the target backend, which hashes as it streams, and verifies
// the placement under the epoch it holds. A stale transfer's late
// verification is rejected by the epoch fence and changes nothing (S3); a
// mismatch never becomes verified (S2). Failures are classified
// (source_unavailable, digest_mismatch, backend_refused) on the ledger
// row, and the caller (the replicate job) retries with backoff.
//
// It reaches the ledger, the backends and other datacenters only through
// the interfaces declared here; store.Store and jobs implement them.
package replication
