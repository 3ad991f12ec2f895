package testbed

import (
	"fmt"
	"os"

	"github.com/rdmago/rdmago/test/testbed/internal/agent"
)

// agentEnv names the guest's virtio port when a binary is started as the
// guest's agent. The host boots a guest with its own executable as the
// agent, so whatever binary imports this package (rdmavm, or a go test
// binary that drives a pair of guests) can serve as one without a separate
// build step.
const agentEnv = "RDMAGO_TESTBED_AGENT"

func init() {
	port := os.Getenv(agentEnv)
	if port == "" {
		return
	}
	os.Unsetenv(agentEnv)
	if err := agent.Serve(port, TopologyFile); err != nil {
		fmt.Fprintln(os.Stderr, "testbed agent:", err)
		os.Exit(1)
	}
	os.Exit(0)
}
