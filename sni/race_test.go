//go:build race

package sni

// raceEnabled skips allocation assertions: the race detector allocates.
const raceEnabled = true
