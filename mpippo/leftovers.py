"""Folders and files a process makes for itself, named after it, so that what a killed one left
can be found and removed by the next start (a launcher's, a rank's, a tool's), and where Open MPI keeps
its own. A leaf: the ranks import it before MPI starts, the launcher and the tools after."""
from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import tempfile

from mpippo.errors import os_reason
from mpippo.usage import file_kind, show

# where Open MPI's shared-memory transport keeps each rank's file (default: /dev/shm itself); Open MPI 4
# calls the transport vader. Only the environment is read: a folder chosen in an MCA parameter file is not seen.
SHM_VAR = "OMPI_MCA_btl_sm_backing_directory"
SHM_VARS = (SHM_VAR, "OMPI_MCA_btl_vader_backing_directory")


def shm_chosen(env) -> bool:
    """Whether the environment already names the shared-memory folder (the user's, or a launcher's of ours);
    an empty value names none (Open MPI would put its files at '(null)/...'), as slurm/common.sh reads it."""
    return any(env.get(v) for v in SHM_VARS)

# where Open MPI (its runtime and every rank) makes its session folder: the first of these that is set,
# even empty (then its folder goes in /), /tmp where none is (PMIx's pmix_tmp_directory)
TEMP_VARS = ("TMPDIR", "TEMP", "TMP")


def temp_folder_problem(env=os.environ) -> str | None:
    """What stops Open MPI from making its session folder where `env` sends it, in one line, or None.
    A TMPDIR that is a file (or lies under one, or where this user may not make a folder) ends mpirun
    before any rank starts, in a box of Open MPI's text and its own exit status 213; the launcher, the
    tools and the batch scripts say it first. A folder that does not exist yet is fine: Open MPI makes it."""
    var = next((v for v in TEMP_VARS if v in env), None)
    if var is None:
        return None
    value = env[var]
    said = f"{var}={show(value)}" + ("" if value else " (empty: Open MPI then makes its folder in /)")
    head = path = os.path.abspath(value) if value else "/"
    while not os.path.lexists(head):  # the nearest part that exists ("/" always does)
        head = os.path.dirname(head)
    fix = f"set {var} to a folder you can write in, or unset it (Open MPI keeps its session files there)"
    if not os.path.isdir(head):
        kind = file_kind(os.lstat(head).st_mode)
        return f"{said}{f' is {kind}' if head == path else f' lies under {show(head)}, which is {kind}'}, not a folder: {fix}"
    try:  # (not os.access: root "may" write in /sys, where mkdir fails)
        probe = tempfile.mkdtemp(prefix=owned_prefix("probe"), dir=head)
    except OSError as e:
        return f"{said}: no folder can be made in {show(head)} ({os_reason(e)}): {fix}"
    with contextlib.suppress(OSError):  # (one left is swept as any folder named so: sweep_leftovers)
        os.rmdir(probe)
    return None


# ---- folders (and marks) a process makes for itself, named so that what a killed one left can be found ----
# mpippo-<what>-<boot>.<pid namespace>.<pid>-<random>: kill -9 leaves its maker no chance to remove one,
# so the next process that makes one removes those of this user whose maker no longer runs. A pid means
# something only in its own pid namespace of its own running kernel: <boot>, the kernel's boot id (random
# at each boot, so another node's), names that kernel, because the initial namespace's number is the same
# on every host and a temporary folder may be shared by several nodes; <pid namespace> keeps apart the
# containers that share one /dev/shm. Only names made here, under this boot, are ever judged.
OWNED = re.compile(r"mpippo-[a-z0-9-]+?-([0-9a-f]{8}\.\d+)\.(\d+)-")
UNKNOWN_BOOT = "0" * 8


@functools.cache
def owner() -> str:
    """<boot>.<pid namespace>: whose pids a name's pid is (slurm/common.sh makes the same)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read(8)
    except OSError:
        boot = ""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{boot if re.fullmatch('[0-9a-f]{8}', boot) else UNKNOWN_BOOT}.{ns}"


def owned_prefix(what: str) -> str:
    return f"mpippo-{what}-{owner()}.{os.getpid()}-"


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's process now: ours (the folder's maker) has ended
        return True
    except (OverflowError, ValueError):  # no pid at all (a name made to look like ours): never judged
        return False
    return False


def sweep_leftovers(places: tuple[str, ...] | None = None) -> list[str]:
    """Remove the folders of `places` (/dev/shm and the temporary folder) that a process of this
    user named as its own and left behind when killed, and the files so named (a batch script's
    listening mark, slurm/common.sh); returns their paths. A link is left alone. Where the kernel's
    boot id cannot be read, only /dev/shm (never another node's) is swept; where the pid namespace
    cannot be read, nothing."""
    me, uid, removed = owner(), os.getuid(), []
    places = places or ("/dev/shm", tempfile.gettempdir())
    if me.startswith(UNKNOWN_BOOT + "."):  # which node made a name elsewhere cannot be told
        places = tuple(p for p in places if p == "/dev/shm")
    if me.endswith(".0"):  # nor which container (pid namespace) made a name in /dev/shm: nothing is judged
        return removed
    for place in places:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for e in entries:
            m = OWNED.match(e.name)
            try:
                folder = e.is_dir(follow_symlinks=False)
                mine = (m and m[1] == me and (folder or e.is_file(follow_symlinks=False))
                        and e.stat(follow_symlinks=False).st_uid == uid)
            except OSError:
                continue
            if mine and _gone(int(m[2])):
                if folder:
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                removed.append(e.path)
    return removed


def own_rank_shm_folder() -> str | None:
    """Give this rank, before MPI starts, a folder of its own in /dev/shm for Open MPI's shared-memory
    file, where no launcher of ours chose one (a bare `mpirun`, srun on several nodes) and the user did
    not: a job killed with -9 leaves its files (sm_segment.<node>.<uid>.<jobid>.<rank>, after a 16-bit
    hash that two jobs of one node may share) where no later run could tell whose they are. Named after
    this rank, what a killed rank leaves is removed by the next start. Each rank tells its peers its
    file's path at start-up, so one job's folders need not be one. (Another MPI reads no such variable:
    the folder stays empty.) Returns the folder, or None where none can be made (Open MPI's default)."""
    if shm_chosen(os.environ) or not os.path.isdir("/dev/shm"):
        return None
    sweep_leftovers(("/dev/shm",))
    try:
        folder = tempfile.mkdtemp(prefix=owned_prefix("sm"), dir="/dev/shm")
    except OSError:  # full or read-only
        return None
    os.environ[SHM_VAR] = folder
    return folder
