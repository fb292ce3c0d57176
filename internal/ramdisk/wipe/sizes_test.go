package wipe

import "unsafe"

func unsafeSizeofAdmin() uintptr { return unsafe.Sizeof(nvmeAdminCmd{}) }
func unsafeSizeofSG() uintptr    { return unsafe.Sizeof(sgIOHdr{}) }
