package proc

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/berthsh/berth/errdefs"
)

// user is a resolved account inside the sandbox.
type user struct {
	name     string
	uid, gid uint32
	groups   []uint32
	home     string
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// lookupUser resolves "" (the guest's own root), a name from /etc/passwd, a
// numeric uid, or uid:gid.
func lookupUser(spec string) (user, error) {
	if spec == "" {
		spec = "0"
	}
	entries := readPasswd()
	if uidS, gidS, ok := strings.Cut(spec, ":"); ok || isNumber(spec) {
		uid, err := strconv.ParseUint(uidS, 10, 32)
		if err != nil {
			return user{}, errdefs.New(errdefs.InvalidArgument, "user: %q is not uid[:gid]", spec)
		}
		u := user{uid: uint32(uid), gid: uint32(uid), home: "/"}
		for _, e := range entries {
			if e.uid == u.uid {
				u.name, u.gid, u.home = e.name, e.gid, e.home
				break
			}
		}
		if ok {
			gid, err := strconv.ParseUint(gidS, 10, 32)
			if err != nil {
				return user{}, errdefs.New(errdefs.InvalidArgument, "user: %q is not uid[:gid]", spec)
			}
			u.gid = uint32(gid)
		}
		if u.name != "" {
			u.groups = groupsOf(u.name, u.gid)
		}
		return u, nil
	}
	for _, e := range entries {
		if e.name == spec {
			return user{name: e.name, uid: e.uid, gid: e.gid, home: e.home, groups: groupsOf(e.name, e.gid)}, nil
		}
	}
	return user{}, errdefs.New(errdefs.InvalidArgument, "user: %q not found in the sandbox's /etc/passwd", spec)
}

func isNumber(s string) bool {
	_, err := strconv.ParseUint(s, 10, 32)
	return err == nil
}

func readPasswd() []passwdEntry {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []passwdEntry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) < 7 {
			continue
		}
		uid, err1 := strconv.ParseUint(fs[2], 10, 32)
		gid, err2 := strconv.ParseUint(fs[3], 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, passwdEntry{name: fs[0], uid: uint32(uid), gid: uint32(gid), home: fs[5]})
	}
	return out
}

// groupsOf lists the primary gid and every /etc/group that names the user.
func groupsOf(name string, primary uint32) []uint32 {
	groups := []uint32{primary}
	f, err := os.Open("/etc/group")
	if err != nil {
		return groups
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Split(sc.Text(), ":")
		if len(fs) < 4 {
			continue
		}
		gid, err := strconv.ParseUint(fs[2], 10, 32)
		if err != nil || uint32(gid) == primary {
			continue
		}
		for _, m := range strings.Split(fs[3], ",") {
			if m == name {
				groups = append(groups, uint32(gid))
				break
			}
		}
	}
	return groups
}
