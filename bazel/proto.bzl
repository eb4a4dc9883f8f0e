"""Generates C++ (and Python) code from a .proto with the system protoc.

Bazel 4's proto_library needs @com_google_protobuf, a download; this macro
runs Debian's /usr/bin/protoc with grpc_cpp_plugin / grpc_python_plugin
instead. Import paths are relative to the workspace root
(`import "proto/apapo/v1/model.proto";`), so generated headers are included
as "proto/apapo/v1/model.pb.h" and Python modules import as
`proto.apapo.v1.model_pb2` (with bazel-bin on sys.path).
"""

_PROTOC = "/usr/bin/protoc"
_CPP_PLUGIN = "/usr/bin/grpc_cpp_plugin"
_PY_PLUGIN = "/usr/bin/grpc_python_plugin"

def apapo_proto_library(name, src, deps = [], grpc = False, visibility = ["//visibility:public"]):
    """Declares C++ and Python code generated from one .proto file.

    Targets:
      <name>_protos:   the .proto and the .protos it imports (transitively).
      <name>_cc_proto: cc_library with <base>.pb.{h,cc} (and .grpc.pb.{h,cc}).
      <name>_py_proto: <base>_pb2.py (and _pb2_grpc.py) for Python clients.

    Args:
      name: base name of the targets.
      src: the .proto file, in this package.
      deps: names (in this package) of apapo_proto_library targets it imports.
      grpc: whether the file defines services.
      visibility: visibility of the generated targets.
    """
    base = src[:-len(".proto")]
    pkg = native.package_name()

    root = "."

    native.filegroup(
        name = name + "_protos",
        srcs = [src] + [":" + d + "_protos" for d in deps],
        visibility = visibility,
    )

    cc_outs = [base + ".pb.h", base + ".pb.cc"]
    py_outs = [base + "_pb2.py"]
    grpc_flags = ""
    py_grpc_flags = ""
    if grpc:
        cc_outs += [base + ".grpc.pb.h", base + ".grpc.pb.cc"]
        py_outs += [base + "_pb2_grpc.py"]
        grpc_flags = "--grpc_out=$(GENDIR)/%s --plugin=protoc-gen-grpc=%s " % (root, _CPP_PLUGIN)
        py_grpc_flags = "--grpc_python_out=$(GENDIR)/%s --plugin=protoc-gen-grpc_python=%s " % (root, _PY_PLUGIN)

    native.genrule(
        name = name + "_cc_gen",
        srcs = [":" + name + "_protos"],
        outs = cc_outs,
        cmd = "%s -I%s --cpp_out=$(GENDIR)/%s %s%s/%s" % (
            _PROTOC,
            root,
            root,
            grpc_flags,
            pkg,
            src,
        ),
        message = "protoc (C++) " + src,
    )

    native.genrule(
        name = name + "_py_gen",
        srcs = [":" + name + "_protos"],
        outs = py_outs,
        cmd = "%s -I%s --python_out=$(GENDIR)/%s %s%s/%s" % (
            _PROTOC,
            root,
            root,
            py_grpc_flags,
            pkg,
            src,
        ),
        message = "protoc (Python) " + src,
    )

    native.filegroup(
        name = name + "_py_proto",
        srcs = py_outs,
        visibility = visibility,
    )

    native.cc_library(
        name = name + "_cc_proto",
        srcs = [base + ".pb.cc"] + ([base + ".grpc.pb.cc"] if grpc else []),
        hdrs = [base + ".pb.h"] + ([base + ".grpc.pb.h"] if grpc else []),
        copts = ["-Wno-unused-parameter"],
        deps = [":" + d + "_cc_proto" for d in deps] + (
            ["//third_party:grpc"] if grpc else ["//third_party:protobuf"]
        ),
        visibility = visibility,
    )
