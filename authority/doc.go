// Package authority is the pure core of Blobplane's authority runtime
// (spec ZBP-5, partitioned-stateful-services.md): the slot key space, the
// signed partition map and its deltas, the routing contract, and the lease
// transition rules that the Postgres lease store implements.
//
// Everything here is a function over plain values. There is no database, no
// HTTP and no clock read: callers pass wall time for records and key windows,
// and a MonoClock reading for self-fencing. The packages that do I/O (the
// lease store, the lease keeper, the controller, the routing middleware, the
// client) are built on top and decide nothing that this package decides.
//
// In Blobplane the partition key is the repository name: a repository's home
// is the primary of the partition that owns its slot.
//
// Requirement ids (R1, V4, ...) in comments refer to ZBP-5 (ZBP-5-R1 etc.).
// docs/authority.md gives the map of what is covered and what is not.
package authority
