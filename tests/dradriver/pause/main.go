// Command pause is the pod sandbox ("pause") and consumer image of the real node in dra-guard's
// end-to-end tests: it prints DRA_GUARD_TEST_DEVICE (set by the test driver's CDI edit, when the
// container got a prepared claim), reaps children, and exits 0 on SIGTERM or SIGINT.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if dev, ok := os.LookupEnv("DRA_GUARD_TEST_DEVICE"); ok {
		fmt.Printf("pause: DRA_GUARD_TEST_DEVICE=%s\n", dev)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			for {
				pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		fmt.Printf("pause: %s, exiting\n", sig)
		return
	}
}
