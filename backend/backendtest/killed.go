package backendtest

import (
	"bufio"
	"os"
	"os/exec"
	"testing"
)

// StartKilledWriter re-executes the running test binary as a writer
// (running TestKilledWriterHelper with env set) and returns once the helper
// prints "WRITING", i.e. its write is under way. The helper blocks on its
// stdin, held open here, until the caller kills it. No sleeps: the line is
// the signal.
func StartKilledWriter(t *testing.T, env string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledWriterHelper$", "-test.v")
	cmd.Env = append(os.Environ(), env)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close() })
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if sc.Text() == "WRITING" {
			return cmd
		}
	}
	t.Fatalf("helper ended before writing: %v", sc.Err())
	return nil
}
