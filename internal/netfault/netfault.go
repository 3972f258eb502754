// Package netfault is a loopback TCP proxy that cuts one direction of its
// connections at a time: the one-way network partitions of the chaos
// tests (issue 30). A cut direction holds its bytes in flight — as TCP
// does while it retransmits into a partition — and delivers them when
// healed; the other direction flows on.
package netfault

import (
	"net"
	"sync"
)

// Direction is one way through the proxy.
type Direction int

const (
	// Up is client → server: a cut Up is a node whose requests do not
	// arrive (it hears, it is not heard).
	Up Direction = iota
	// Down is server → client: a cut Down is a node whose requests land
	// but whose answers do not (it is heard, it hears nothing).
	Down
)

func (d Direction) String() string {
	if d == Up {
		return "up"
	}
	return "down"
}

// Proxy forwards every connection accepted on its loopback listener to a
// fresh connection from dial.
type Proxy struct {
	ln   net.Listener
	dial func() (net.Conn, error)

	mu     sync.Mutex
	cond   *sync.Cond
	cut    [2]bool
	closed bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// Listen starts a proxy on 127.0.0.1 (a free port) to what dial reaches.
func Listen(dial func() (net.Conn, error)) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, dial: dial, conns: map[net.Conn]struct{}{}}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listening address (host:port).
func (p *Proxy) Addr() *net.TCPAddr { return p.ln.Addr().(*net.TCPAddr) }

// Cut stops d: bytes read in that direction wait until Heal.
func (p *Proxy) Cut(d Direction) {
	p.mu.Lock()
	p.cut[d] = true
	p.mu.Unlock()
}

// Heal lets both directions flow again, delivering what was held.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = [2]bool{}
	p.cond.Broadcast()
	p.mu.Unlock()
}

// Close stops the listener and every connection, and waits for them.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.cond.Broadcast()
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := p.dial()
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client, server) {
			return
		}
		p.wg.Add(2)
		go p.pipe(server, client, Up)
		go p.pipe(client, server, Down)
	}
}

func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst, holding each chunk while d is cut; when either
// side ends, both close (a connection is whole or gone).
func (p *Proxy) pipe(dst, src net.Conn, d Direction) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
		dst.Close()
		src.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(d) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait blocks while d is cut; false once the proxy is closed.
func (p *Proxy) wait(d Direction) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cut[d] && !p.closed {
		p.cond.Wait()
	}
	return !p.closed
}
