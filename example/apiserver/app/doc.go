// Package app wires the example standalone genericapiserver: secure serving
// on 127.0.0.1 with an in-memory self-signed serving certificate (or the
// given files), evercert's rotating loopback certificate and loopback client
// (loopback.ApplyToConfig), a token authenticator for the loopback token, a
// privileged-group authorizer, and a post-start hook that calls the server
// through a clientset built once from the loopback config, counting
// evercert_loopback_selfcheck_total. There is no etcd and no storage-backed
// API: the server serves /healthz, /livez, /readyz, /version, /metrics and
// discovery (/apis).
//
// The package main next to it only parses flags and calls Run; tests build
// servers through NewServer.
package app
