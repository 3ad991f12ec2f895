// Package verbs wraps libibverbs: devices, ports and GID tables, and (in
// later steps) protection domains, memory regions, completion queues and
// queue pairs, together with pure-Go models of every QP attribute and the
// IBTA state-transition rules, so that a bad transition is refused in Go with
// an error that names what is missing before the driver sees it.
//
// Everything that can be pure Go is: the package builds with CGO_ENABLED=0,
// and then every call that needs libibverbs returns ErrNoCgo.
package verbs
