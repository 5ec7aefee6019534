"""The test harness's own promise: a job Open MPI failed to start is started again, nothing else is."""
import subprocess

from conftest import LAUNCH_FAILED, relaunched


def _launches(*outcomes):
    """A launch that answers `outcomes` in turn (exit code, stderr), and the count of calls."""
    calls = []

    def launch():
        code, err = outcomes[len(calls)]
        calls.append(code)
        return subprocess.CompletedProcess(["mpirun", "-n", "2"], code, "", err)
    return launch, calls


def test_a_job_open_mpi_failed_to_start_is_started_again():
    launch, calls = _launches((213, f"---\nThe {LAUNCH_FAILED}. We cannot\ncontinue.\n"), (0, ""))
    assert relaunched(launch).returncode == 0 and len(calls) == 2


def test_a_job_that_failed_on_its_own_is_not_started_again():
    launch, calls = _launches((2, "mpippo: error: training.algo: 'x' is not one of ..."), (0, ""))
    assert relaunched(launch).returncode == 2 and len(calls) == 1


def test_relaunching_stops_after_three_starts():
    failed = (213, LAUNCH_FAILED)
    launch, calls = _launches(failed, failed, failed, (0, ""))
    assert relaunched(launch).returncode == 213 and len(calls) == 3
