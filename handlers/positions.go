package handlers

import (
	"net/http"

	"github.com/blobplane/blobplane"
	"github.com/blobplane/blobplane/authority"
	"github.com/blobplane/blobplane/partstate"
	"github.com/blobplane/blobplane/store"
)

// minPosition honours X-Min-Position, a position token a mutating
// response carried (X-Partition-Position, ZBP-5-R107), on a request of
// the blob API: the request then sees every change committed up to that
// position. Blobplane's reads come from the Postgres ledger, where the
// change behind a token committed before the token was issued, so the
// request runs without the in-process caches (store.Fresh), whose
// entries may wait for a notification still in flight; nothing waits. A
// malformed token is refused (invalid, POSITION_INVALID), and so is one
// naming a partition the current map does not hold (R108: a split or
// merge restarted the LSNs under new ids, so the position can never be
// reached: position_gone, 410, POSITION_GONE), never waited on.
func minPosition(current func() *authority.VerifiedMap, fail func(http.ResponseWriter, *http.Request, error, string)) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			v := r.Header.Get(partstate.MinPositionHeader)
			if v == "" {
				next.ServeHTTP(w, r)
				return
			}
			pos, err := partstate.ParsePosition(v)
			if err != nil {
				fail(w, r, blobplane.Errorf(blobplane.CodeInvalid, "%s: %v", partstate.MinPositionHeader, err), ociPositionInvalid)
				return
			}
			if !holdsPartition(current, pos.Partition) {
				fail(w, r, blobplane.Errorf(blobplane.CodePositionGone,
					"%s names partition %s, which the current map does not hold (split or merged away): its positions can never be reached; read without it, or with a position a current partition issued",
					partstate.MinPositionHeader, pos.Partition), ociPositionGone)
				return
			}
			next.ServeHTTP(w, r.WithContext(store.Fresh(r.Context())))
		})
	}
}

// holdsPartition reports whether the current map names partition id.
func holdsPartition(current func() *authority.VerifiedMap, id string) bool {
	if current == nil {
		return false
	}
	vm := current()
	return vm != nil && vm.Map().Partition(id) != nil
}
