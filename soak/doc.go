// Package soak holds Blobplane's fault tests with real processes on a
// private Postgres cluster. The package has no code of its own: the tests
// are its _test.go files. `make test` runs them; `go test -short` skips
// them.
//
//   - The crash soak (issue 27, "Acknowledged means kept", soak_test.go):
//     api and worker processes for two datacenters take concurrent
//     uploads while the test kills them with SIGKILL, restarts them with
//     the same node ids, and crash-restarts Postgres; at the end every
//     upload answered 201 or 202 must read back with its exact bytes
//     (docs/uploads.md).
//   - The replication faults (issue 28, replication_test.go): three
//     datacenters, one on MinIO; a blob reaches all three; a worker
//     SIGKILLed mid-transfer of 512 MiB leaves no half object and its
//     restart completes the copy under a newer epoch; a MinIO outage makes
//     the copy wait (failed/backend_refused, backlog metrics up) and it
//     completes by its own retry once MinIO is back; a datacenter added to
//     a repository's policy gets its copy from the reconciler
//     (docs/replication.md). Also: a datacenter joining a running cluster
//     converges, and the scrub repairs a copy damaged behind its back.
//   - Reads (issue 29, reads_test.go): a blob read from another
//     datacenter before and after its transfer (ranges, 304, pending
//     503); damage found by reads (bit flip, truncation, deletion) is
//     never served as a complete body, is counted and repaired; a blob
//     lost everywhere answers 404 and a re-push restores it
//     (docs/reads.md).
//   - Leaks (issue 29, leaks_test.go): an api SIGKILLed between writing
//     the bytes and verifying the placement, and one killed mid-body,
//     leave nothing once the sweeps have run, with no row edited by hand
//     (docs/uploads.md).
package soak
