// Command static is a tiny static binary the build tests put in an initramfs.
package main

func main() {}
