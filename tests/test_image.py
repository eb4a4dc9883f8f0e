"""The container image (deploy/image): built with podman from the binaries
just built here (build.sh --prebuilt), its filesystem exported, and a
coordinator plus a worker daemon run from it under chroot as its
unprivileged user (no OCI runtime works on this machine: a container
cannot be started, a chroot can).

Each process from the image runs in a mount namespace of its own
(unshare --mount) where /proc, /dev and /tmp are mounted over the exported
tree: the kernel drops those mounts when the process ends, however it ends,
so nothing stays mounted on the tree the test then deletes."""

import os
import re
import shutil
import subprocess
import tempfile
import time
import unittest

from lib import apapo_testlib as t

IMAGE_DIR = os.path.join(t.ROOT, "deploy", "image")
BUILD = os.path.join(IMAGE_DIR, "build.sh")
BINARIES = ("apapo-coordinator", "apapo-worker", "apapoctl")
# What a runtime image must not hold (the builder stage's tools).
BUILD_TOOLS = ("gcc", "gcc-12", "g++", "g++-12", "cpp", "cpp-12", "clang", "clang-14",
               "bazel-bootstrap", "binutils", "make", "protobuf-compiler")

# Mounts made inside each process's own mount namespace before chroot:
# $1 is the exported tree, the rest the command. /dev gets a tmpfs with the
# few device nodes a daemon opens, bound from the host's.
IN_NAMESPACE = r"""
set -e
root=$1; shift
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=0755,nosuid tmpfs "$root/dev"
for d in null zero full random urandom; do
  : > "$root/dev/$d"; mount --bind "/dev/$d" "$root/dev/$d"
done
mkdir "$root/dev/shm"; mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
exec chroot --userspec="$USERSPEC" "$root" "$@"
"""


def skip_reason():
    if os.geteuid() != 0:
        return "needs root (podman build --isolation=chroot, chroot, mounts)"
    for tool in ("podman", "debootstrap", "unshare", "chroot"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    return None


def image_tag():
    """The tag build.sh gives the image (deploy/image/VERSION)."""
    r = subprocess.run(["bash", BUILD, "--print-tag"], capture_output=True, text=True,
                       timeout=60, check=True)
    return r.stdout.strip()


def image_uid():
    """The uid the Containerfile's USER line names."""
    with open(os.path.join(IMAGE_DIR, "Containerfile")) as f:
        m = re.search(r"^USER (\d+):(\d+)$", f.read(), re.M)
    return int(m.group(1)), int(m.group(2))


@unittest.skipIf(skip_reason(), skip_reason())
class ImageTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tag = image_tag()
        cls.uid, cls.gid = image_uid()
        cls.dir = tempfile.mkdtemp(prefix="image-", dir=os.environ.get("TEST_TMPDIR"))
        cls.addClassCleanup(cls.remove_dir)
        cls.root = os.path.join(cls.dir, "rootfs")
        os.mkdir(cls.root)
        start = time.monotonic()
        r = subprocess.run(["bash", BUILD, "--prebuilt", t.BIN], capture_output=True,
                           text=True, timeout=1800)
        if r.returncode != 0:
            raise AssertionError(f"build.sh failed ({r.returncode}):\n{r.stderr[-4000:]}")
        built = time.monotonic()
        name = f"apapo-image-test-{os.getpid()}"
        subprocess.run(["podman", "create", "--name", name, cls.tag], check=True,
                       capture_output=True, timeout=120)
        cls.addClassCleanup(subprocess.run, ["podman", "rm", "--force", name],
                            capture_output=True, timeout=120)
        archive = os.path.join(cls.dir, "rootfs.tar")
        subprocess.run(["podman", "export", "--output", archive, name], check=True,
                       capture_output=True, timeout=300)
        subprocess.run(["tar", "-C", cls.root, "--numeric-owner", "-xf", archive],
                       check=True, timeout=300)
        os.remove(archive)
        inspect = subprocess.run(
            ["podman", "image", "inspect", "--format", "{{.Size}} {{.Config.User}}", cls.tag],
            check=True, capture_output=True, text=True, timeout=60).stdout.split()
        cls.size, cls.user = int(inspect[0]), inspect[1]
        print(f"\n  image {cls.tag}: {cls.size / 1e6:.0f} MB; build.sh {built - start:.0f}s, "
              f"export {time.monotonic() - built:.0f}s", flush=True)

    @classmethod
    def remove_dir(cls):
        # Never delete through a mount (a bound /dev would take the host's
        # device nodes with it): every mount lived in a namespace of its own.
        with open("/proc/self/mountinfo") as f:
            mounted = [line.split()[4] for line in f
                       if line.split()[4].startswith(cls.dir + "/")]
        if mounted:
            raise RuntimeError(f"still mounted, {cls.dir} left in place: {mounted}")
        shutil.rmtree(cls.dir, ignore_errors=True)

    def chroot_argv(self, *argv):
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                IN_NAMESPACE, "sh", self.root, *argv]

    def chroot_env(self, user=True):
        userspec = f"{self.uid}:{self.gid}" if user else "0:0"
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp", "USERSPEC": userspec,
                "OPENBLAS_NUM_THREADS": "1"}

    def run_in_image(self, *argv, user=True, timeout=60):
        return subprocess.run(self.chroot_argv(*argv), env=self.chroot_env(user),
                              capture_output=True, text=True, timeout=timeout)

    def test_binaries_run_and_find_every_library(self):
        for b in BINARIES:
            r = self.run_in_image(f"/usr/bin/{b}", "--version")
            self.assertEqual(r.returncode, 0, f"{b}: {r.stdout}{r.stderr}")
            self.assertIn(b, r.stdout)
            r = self.run_in_image("ldd", f"/usr/bin/{b}")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("not found", r.stdout, b)
        # LibTorch's BLAS is OpenBLAS, not the reference implementation.
        r = self.run_in_image("ldd", "/usr/bin/apapo-worker")
        blas = re.search(r"libblas\.so\.3 => (\S+)", r.stdout)
        self.assertTrue(blas, r.stdout)
        r = self.run_in_image("readlink", "-f", blas.group(1))
        self.assertIn("openblas", r.stdout, r.stderr)

    def test_runs_as_an_unprivileged_user(self):
        self.assertEqual(self.user, f"{self.uid}:{self.gid}")
        with open(os.path.join(self.root, "etc", "passwd")) as f:
            users = {fields[0]: fields for fields in
                     (line.rstrip("\n").split(":") for line in f)}
        self.assertIn("apapo", users)
        self.assertEqual(int(users["apapo"][2]), self.uid)
        self.assertNotEqual(self.uid, 0)
        self.assertEqual(users["apapo"][6], "/usr/sbin/nologin")
        r = self.run_in_image("id", "-u")
        self.assertEqual(r.stdout.strip(), str(self.uid), r.stderr)
        st = os.stat(os.path.join(self.root, "var", "lib", "apapo", "checkpoints"))
        self.assertEqual((st.st_uid, st.st_gid), (self.uid, self.gid))

    def test_holds_no_build_tools(self):
        r = self.run_in_image("dpkg-query", "-W", "-f=${Package}\n")
        self.assertEqual(r.returncode, 0, r.stderr)
        packages = set(r.stdout.split())
        self.assertIn("libtorch1.13", packages)
        self.assertFalse(packages & set(BUILD_TOOLS), packages & set(BUILD_TOOLS))
        self.assertFalse({p for p in packages if p.endswith("-dev")})
        for tool in ("gcc", "g++", "cc", "c++", "clang", "ld", "as", "bazel", "protoc"):
            self.assertFalse(os.path.lexists(os.path.join(self.root, "usr", "bin", tool)), tool)
        self.assertFalse(os.listdir(os.path.join(self.root, "var", "lib", "apt", "lists")))
        # The runtime libraries, not the builder's toolchain (1.05 GB on
        # 2026-12-01, most of it LibTorch's Depends: OpenCV, FFmpeg, Mesa).
        self.assertLess(self.size, 1.5e9)

    def test_a_worker_registers_with_a_coordinator_from_the_image(self):
        procs = []

        def start(*argv):
            p = t.Process(self.chroot_argv(*argv), env=self.chroot_env())
            procs.append(p)
            self.addCleanup(p.stop)
            return p

        coordinator = start("apapo-coordinator", "--host=127.0.0.1", "--port=0",
                            "--metrics_port=0", "--state=/tmp/coordinator.db",
                            "--heartbeat_interval=500ms")
        port = int(coordinator.wait_for_line(r"listening on port (\d+)", 60).group(1))
        worker = start("apapo-worker", f"--coordinator=127.0.0.1:{port}",
                       "--id=image-w1", "--host=127.0.0.1", "--threads=1")
        worker.wait_for_line(r"registered as image-w1", 60)

        # The coordinator lists it, asked by the image's own apapoctl.
        def listed():
            r = self.run_in_image("apapoctl", f"--coordinator=127.0.0.1:{port}", "workers")
            return r.returncode == 0 and "image-w1" in r.stdout and r.stdout
        t.wait_until(listed, 60, "apapoctl workers to list image-w1")
        # Both run as the image's user, not root.
        for p in procs:
            with open(f"/proc/{p.proc.pid}/status") as f:
                uids = re.search(r"^Uid:\s+(\d+)", f.read(), re.M).group(1)
            self.assertEqual(int(uids), self.uid, p.argv)
        # SIGTERM ends both cleanly.
        self.assertEqual(worker.stop(), 0, worker.output())
        self.assertEqual(coordinator.stop(), 0, coordinator.output())


if __name__ == "__main__":
    unittest.main()
