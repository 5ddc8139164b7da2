// A Go program (built with and without cgo): not a target, must behave exactly as without the
// injector.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("hello from go PYTHONPATH=%q NODE_OPTIONS=%q\n", os.Getenv("PYTHONPATH"), os.Getenv("NODE_OPTIONS"))
}
