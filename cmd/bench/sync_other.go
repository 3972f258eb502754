//go:build !unix

package main

// syncAll has nothing to do where there is no sync(2) (and no page cache
// to drop: dropPageCache then reports that it could not).
func syncAll() {}
