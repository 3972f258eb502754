package store

import (
	"context"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/blobplane/blobplane"
)

// TestConnectionLossIsUnavailable: a connection that cannot be made, or
// that broke, is the database's unavailability (503, retry), not an
// internal error (the soak of issue 27 saw 500s while Postgres
// restarted). Real connections: a refused connect, and one whose socket
// is closed under it.
func TestConnectionLossIsUnavailable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now

	ctx := context.Background()
	_, err = pgx.Connect(ctx, "postgres://x@"+addr+"/x?connect_timeout=5")
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	if got := dbErr("ping", err); blobplane.ErrorCode(got) != blobplane.CodeUnavailable {
		t.Errorf("refused connect: %v (code %s), want unavailable", got, blobplane.ErrorCode(got))
	}

	// A server that accepts and hangs up at once: the startup read is
	// cut short.
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, err = pgx.Connect(ctx, "postgres://x@"+l.Addr().String()+"/x?sslmode=disable&connect_timeout=5")
	if err == nil {
		t.Fatal("connected to a server that hangs up")
	}
	if got := dbErr("ping", err); blobplane.ErrorCode(got) != blobplane.CodeUnavailable {
		t.Errorf("connection cut: %v (code %s), want unavailable", got, blobplane.ErrorCode(got))
	}
	// A statement's own failure stays what it was.
	if got := dbErr("x", context.Canceled); got != context.Canceled {
		t.Errorf("canceled: %v", got)
	}
}
