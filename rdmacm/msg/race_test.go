//go:build race

package msg

// raceEnabled: the race detector slows pure-logic property tests tenfold;
// they run their full size without it (make test runs both).
const raceEnabled = true
