// Package auth is Blobplane's access-control vocabulary, free of I/O:
// repository and principal names, permissions (read < write < admin), grant
// patterns ("team/app", "team/*", "*") and their matching, the token format
// (bp_<id>_<secret>) with its hashing and constant-time verification, and
// the Principal a request acts as.
//
// The store persists tokens (hash only) and grants and loads a Principal in
// one query at authentication; every later decision is a pure call such as
// Principal.Allowed. See docs/auth.md.
package auth
