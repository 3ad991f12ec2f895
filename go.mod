module github.com/rdmago/rdmago

go 1.24.0

require (
	github.com/stretchr/testify v1.12.1
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/net v0.50.0
	golang.org/x/sys v0.41.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
