package proc

import (
	"bufio"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/berthsh/berth/errdefs"
)

// maxAccountFile bounds how much of /etc/passwd or /etc/group is read.
const maxAccountFile = 4 << 20

// user is an account inside the sandbox that a process runs as.
type user struct {
	name string // "" for a uid without a passwd entry
	home string
	// cred is nil for the guest's own identity.
	cred *syscall.Credential
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// lookupUser resolves a spec's user: "" is the guest's own uid and gid, a
// name is looked up in the sandbox's /etc/passwd (supplementary groups from
// /etc/group), "uid" or "uid:gid" is numeric (gid from passwd, else uid).
func lookupUser(spec string) (user, error) {
	if spec == "" {
		u := user{home: "/"}
		if e, ok := passwdByUID(readPasswd(), uint32(os.Getuid())); ok {
			u.name, u.home = e.name, homeOr(e.home)
		}
		return u, nil
	}
	entries := readPasswd()
	uidS, gidS, hasGID := strings.Cut(spec, ":")
	uid, err := parseID(uidS)
	if err != nil && !hasGID {
		for _, e := range entries {
			if e.name == spec {
				return user{name: e.name, home: homeOr(e.home), cred: credential(e.name, e.uid, e.gid)}, nil
			}
		}
		return user{}, errdefs.New(errdefs.InvalidArgument, "user: %q not found in the sandbox's /etc/passwd", spec)
	}
	if err != nil {
		return user{}, errdefs.New(errdefs.InvalidArgument, "user: %q is neither a user name nor uid[:gid]", spec)
	}
	u, gid := user{home: "/"}, uid
	if e, ok := passwdByUID(entries, uid); ok {
		u.name, u.home, gid = e.name, homeOr(e.home), e.gid
	}
	if hasGID {
		if gid, err = parseID(gidS); err != nil {
			return user{}, errdefs.New(errdefs.InvalidArgument, "user: %q is neither a user name nor uid[:gid]", spec)
		}
	}
	u.cred = credential(u.name, uid, gid)
	return u, nil
}

// parseID parses a uid or gid; -1 (all ones) means "unchanged" to the kernel.
func parseID(s string) (uint32, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err == nil && n == math.MaxUint32 {
		err = strconv.ErrRange
	}
	return uint32(n), err
}

func homeOr(home string) string {
	if home == "" {
		return "/"
	}
	return home
}

// credential is uid and gid with the supplementary groups /etc/group gives
// name (none for a nameless uid: root's groups are never inherited).
func credential(name string, uid, gid uint32) *syscall.Credential {
	c := &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
	if name == "" {
		return c
	}
	for _, fs := range readAccounts("/etc/group", 4) {
		g, err := parseID(fs[2])
		if err != nil || g == gid {
			continue
		}
		for _, member := range strings.Split(fs[3], ",") {
			if member == name {
				c.Groups = append(c.Groups, g)
				break
			}
		}
	}
	return c
}

func passwdByUID(entries []passwdEntry, uid uint32) (passwdEntry, bool) {
	for _, e := range entries {
		if e.uid == uid {
			return e, true
		}
	}
	return passwdEntry{}, false
}

func readPasswd() []passwdEntry {
	var out []passwdEntry
	for _, fs := range readAccounts("/etc/passwd", 7) {
		uid, err1 := parseID(fs[2])
		gid, err2 := parseID(fs[3])
		if err1 == nil && err2 == nil {
			out = append(out, passwdEntry{name: fs[0], uid: uid, gid: gid, home: fs[5]})
		}
	}
	return out
}

// readAccounts returns the colon-separated lines of an account file that
// have at least n fields. The file belongs to the sandbox, whose root may
// have made it anything: it is opened without blocking (a FIFO would hang
// the guest), must be a regular file, and is read up to maxAccountFile.
func readAccounts(path string, n int) [][]string {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	var out [][]string
	sc := bufio.NewScanner(io.LimitReader(f, maxAccountFile))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		if fs := strings.Split(line, ":"); len(fs) >= n {
			out = append(out, fs)
		}
	}
	return out
}

// Account is a user inside the sandbox that a file operation acts as.
type Account struct {
	Name string
	Home string
	// Self is the guest's own identity (root inside); UID, GID and Groups
	// are then unused.
	Self   bool
	UID    uint32
	GID    uint32
	Groups []uint32
}

// LookupAccount resolves spec as a process's user would be ("" is the
// guest itself).
func LookupAccount(spec string) (Account, error) {
	u, err := lookupUser(spec)
	if err != nil {
		return Account{}, err
	}
	a := Account{Name: u.name, Home: u.home, Self: u.cred == nil}
	if u.cred != nil {
		a.UID, a.GID, a.Groups = u.cred.Uid, u.cred.Gid, u.cred.Groups
	}
	return a, nil
}

// Names maps uids and gids to the names in the sandbox's /etc/passwd and
// /etc/group.
func Names() (users, groups map[uint32]string) {
	users, groups = map[uint32]string{}, map[uint32]string{}
	for _, e := range readPasswd() {
		if _, ok := users[e.uid]; !ok {
			users[e.uid] = e.name
		}
	}
	for _, fs := range readAccounts("/etc/group", 3) {
		if g, err := parseID(fs[2]); err == nil {
			if _, ok := groups[g]; !ok {
				groups[g] = fs[0]
			}
		}
	}
	return users, groups
}

// LookupOwner parses an owner spec for chown: "name", "uid", "name:group" or
// "uid:gid" (a user alone takes its passwd group).
func LookupOwner(spec string) (uid, gid uint32, err error) {
	userS, groupS, hasGroup := strings.Cut(spec, ":")
	u, err := lookupUser(userS)
	if err != nil || u.cred == nil {
		if err == nil {
			err = errdefs.New(errdefs.InvalidArgument, "owner: %q names no user", spec)
		}
		return 0, 0, err
	}
	uid, gid = u.cred.Uid, u.cred.Gid
	if !hasGroup {
		return uid, gid, nil
	}
	if g, perr := parseID(groupS); perr == nil {
		return uid, g, nil
	}
	for _, fs := range readAccounts("/etc/group", 3) {
		if fs[0] == groupS {
			if g, perr := parseID(fs[2]); perr == nil {
				return uid, g, nil
			}
		}
	}
	return 0, 0, errdefs.New(errdefs.InvalidArgument, "owner: group %q not found in the sandbox's /etc/group", groupS)
}
