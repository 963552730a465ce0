// Command etcd is etcd's server, built from go.etcd.io/etcd/server/v3 at the
// version go.mod pins, for the test control plane (see ../README.md).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
