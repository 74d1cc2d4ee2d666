package e2b_test

import (
	"context"
	"os"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/berthsh/berth/api/e2b/envd/filesystem"
	"github.com/berthsh/berth/api/e2b/envd/process"
)

// TestGeneratedMatchesProto fails when a .proto file changed and
// generate.sh was not run: the descriptor compiled from each file must
// equal the one the committed Go code carries.
func TestGeneratedMatchesProto(t *testing.T) {
	generated := map[string]protoreflect.FileDescriptor{
		"process/process.proto":       process.File_process_process_proto,
		"filesystem/filesystem.proto": filesystem.File_filesystem_filesystem_proto,
	}
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{ImportPaths: []string{"envd"}})}
	for name, gen := range generated {
		files, err := c.Compile(context.Background(), name)
		if err != nil {
			t.Fatalf("compile %s: %v", name, err)
		}
		want, got := normalize(protodesc.ToFileDescriptorProto(files[0])), normalize(protodesc.ToFileDescriptorProto(gen))
		if !proto.Equal(want, got) {
			t.Errorf("%s: the generated Go code does not match the .proto file: run api/e2b/generate.sh", name)
		}
	}
	if _, err := os.Stat("generate.sh"); err != nil {
		t.Fatal(err)
	}
}

// normalize drops what protoc and protocompile record differently and the
// code does not depend on: source positions and derived JSON names.
func normalize(fd *descriptorpb.FileDescriptorProto) *descriptorpb.FileDescriptorProto {
	fd.SourceCodeInfo = nil
	var msgs func([]*descriptorpb.DescriptorProto)
	msgs = func(ms []*descriptorpb.DescriptorProto) {
		for _, m := range ms {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			msgs(m.NestedType)
		}
	}
	msgs(fd.MessageType)
	return fd
}
