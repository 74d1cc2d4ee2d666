package api

import "github.com/berthsh/berth/api/guestapi"

// The file API's types are the guest protocol's: the daemon passes file
// requests to the guest with the sandbox's user and working directory
// filled in, and checks the answers. See guestapi's documentation of each.
type (
	Where           = guestapi.Where
	FileInfo        = guestapi.FileInfo
	StatRequest     = guestapi.StatRequest
	ExistsResult    = guestapi.ExistsResult
	ListRequest     = guestapi.ListRequest
	ListResult      = guestapi.ListResult
	MkdirRequest    = guestapi.MkdirRequest
	MoveRequest     = guestapi.MoveRequest
	RemoveRequest   = guestapi.RemoveRequest
	ChmodRequest    = guestapi.ChmodRequest
	ChownRequest    = guestapi.ChownRequest
	ReadRequest     = guestapi.ReadRequest
	Line            = guestapi.Line
	ReadResult      = guestapi.ReadResult
	WriteRequest    = guestapi.WriteRequest
	EditRequest     = guestapi.EditRequest
	EditResult      = guestapi.EditResult
	GlobRequest     = guestapi.GlobRequest
	GlobResult      = guestapi.GlobResult
	GrepRequest     = guestapi.GrepRequest
	GrepMatch       = guestapi.GrepMatch
	GrepResult      = guestapi.GrepResult
	UploadFile      = guestapi.UploadFile
	UploadRequest   = guestapi.UploadRequest
	FileError       = guestapi.FileError
	FileResult      = guestapi.FileResult
	UploadResult    = guestapi.UploadResult
	DownloadRequest = guestapi.DownloadRequest
	DownloadResult  = guestapi.DownloadResult
	ArchiveResult   = guestapi.ArchiveResult
	WatchEvent      = guestapi.WatchEvent
)
