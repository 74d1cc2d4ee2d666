// Command testtool is the one program of the tiny image the image tests
// build (a static binary in an otherwise empty layer): it says who and
// where it runs, and reads and writes files, so a test can check a
// sandbox made of a foreign image without a shell in it.
//
//	testtool id               uid=U gid=G cwd=DIR
//	testtool env NAME         the variable's value
//	testtool cat FILE         the file
//	testtool write FILE TEXT  writes the file (0644)
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testtool id|env NAME|cat FILE|write FILE TEXT")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "id":
		cwd, _ := os.Getwd()
		fmt.Printf("uid=%d gid=%d cwd=%s\n", os.Getuid(), os.Getgid(), cwd)
	case "env":
		fmt.Println(os.Getenv(os.Args[2]))
	case "cat":
		b, err := os.ReadFile(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Stdout.Write(b)
	case "write":
		if err := os.WriteFile(os.Args[2], []byte(os.Args[3]), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown command", os.Args[1])
		os.Exit(2)
	}
}
