package netfault

import (
	"bufio"
	"net"
	"os"
	"testing"
	"time"
)

// echo is a line echo server: what the proxy fronts in this test.
func echo(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln
}

// roundTrip sends line and reads the echo, giving up after wait: false
// if nothing came back by then.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string, wait time.Duration) bool {
	t.Helper()
	if line != "" {
		if _, err := c.Write([]byte(line + "\n")); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(wait))
	got, err := r.ReadString('\n')
	if err != nil {
		if os.IsTimeout(err) {
			return false
		}
		t.Fatal(err)
	}
	return got == "x\n" || got == "y\n" || got == "z\n"
}

// A cut direction holds its bytes, the connection stays up, and healing
// delivers them in order: either way round.
func TestCutHoldsOneDirectionUntilHealed(t *testing.T) {
	srv := echo(t)
	p, err := Listen(func() (net.Conn, error) { return net.Dial("tcp", srv.Addr().String()) })
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if !roundTrip(t, c, r, "x", 5*time.Second) {
		t.Fatal("no echo through a healthy proxy")
	}
	for _, d := range []Direction{Up, Down} {
		p.Cut(d)
		// 100 ms of silence is the evidence the cut holds; the bytes are
		// then expected, in order, after Heal (not a timing assertion on
		// the happy path: that read waits up to 5 s).
		if roundTrip(t, c, r, "y", 100*time.Millisecond) {
			t.Fatalf("an answer crossed a cut %s", d)
		}
		p.Heal()
		if !roundTrip(t, c, r, "", 5*time.Second) {
			t.Fatalf("the held bytes were not delivered after healing %s", d)
		}
	}
	if !roundTrip(t, c, r, "z", 5*time.Second) {
		t.Fatal("no echo after healing")
	}
}

// Close ends every connection even while a direction is cut.
func TestCloseEndsHeldConnections(t *testing.T) {
	srv := echo(t)
	p, err := Listen(func() (net.Conn, error) { return net.Dial("tcp", srv.Addr().String()) })
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Cut(Down)
	if _, err := c.Write([]byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || os.IsTimeout(err) {
		t.Fatalf("read after Close: %v, want the connection closed", err)
	}
}
