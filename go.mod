module github.com/rdmago/rdmago

go 1.26.0

require github.com/vishvananda/netns v0.0.5

require golang.org/x/sys v0.49.0 // indirect
