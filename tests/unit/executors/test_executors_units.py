"""The engines' own parts (issue 41), fast: the ``--executor`` options, a job in its log, the progress
over jobs, the local engine in this process, the Ray engine's dispatch (on a stand-in for Ray that runs
each task at once), submitit's parameters and its in-process debug executor, and the comparison record.
The engines themselves (a Ray cluster, submitit's local processes) run in tests/e2e/test_scaling_out.py
(slow: they spawn Python)."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from sinkscope.store.comparison_record import read_comparison_record, write_comparison_record
from sinkscope.executors.jobs import Job, Outcome, Progress, run_job
from sinkscope.executors.local import run_local
from sinkscope.executors.settings import ExecutorOptions, check_executor, choose_executor, gpus_per_run
from sinkscope.executors.ray_tasks import run_ray
from sinkscope.executors.run import cluster_gpus, run_jobs
from sinkscope.executors.slurm import executor_for, slurm_parameters
from sinkscope.errors import SinkscopeError, phrase


def square(x: int) -> int:
    print(f"squaring {x}")
    return x * x


def refuse(x: int) -> int:
    raise SinkscopeError(f"no model at m{x}; check the path.")


def crash(x: int) -> int:
    raise ValueError(f"bad {x}")


def _jobs(tmp_path: Path, functions) -> list[Job]:
    return [Job(f"run{k}", str(tmp_path / "logs" / f"run{k}.log"), f, (k,)) for k, f in enumerate(functions)]


# ---- options -------------------------------------------------------------------------------------

def test_engine_options_take_their_names_and_leave_the_rest():
    executor_options = choose_executor({"executor": "local", "jobs": 3, "seq_len": 32, "slurm_time": None})
    assert executor_options == ExecutorOptions(jobs=3) and not executor_options.in_process
    assert ExecutorOptions().in_process and not ExecutorOptions(executor="slurm").in_process


@pytest.mark.parametrize("given, words", [
    ({"executor": "dask"}, "unknown --executor 'dask'; use local, ray, slurm"),
    ({"jobs": 0}, "--jobs must be a positive integer (got 0)"),
    ({"jobs": True}, "--jobs must be a positive integer"),
    ({"slurm_time": -5}, "--slurm-time must be a positive integer"),
    ({"ray_gpus_per_run": -1}, "--ray-gpus-per-run must be a finite number, 0 or more"),
    ({"slurm_cluster": "pbs"}, "unknown --slurm-cluster 'pbs'"),
    ({"executor": "slurm", "jobs": 2}, "--jobs sets the local executor's processes"),
])
def test_bad_engine_options_are_one_sentence(given, words):
    with pytest.raises(SinkscopeError) as caught:
        check_executor(ExecutorOptions(**given))
    assert words in str(caught.value)
    assert "--" not in caught.value.phrased("api")  # the API names them as keywords


def test_a_missing_engine_package_names_the_pip_command(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "submitit" else real(name, *a))
    with pytest.raises(SinkscopeError, match=r"pip install 'sinkscope\[slurm\]'"):
        check_executor(ExecutorOptions(executor="slurm"))


def test_slurm_off_a_cluster_says_where_to_run_it(monkeypatch):
    import importlib.util

    import sinkscope.executors.settings as choose_executor

    real = importlib.util.find_spec  # the fast tier runs without the engines: submitit is taken as installed
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "submitit" else real(name, *a))
    monkeypatch.setattr(choose_executor.shutil, "which", lambda name: None)
    with pytest.raises(SinkscopeError, match="does not have; run the command on the cluster's login node, or try the "
                                             "runs here with --slurm-cluster local"):
        check_executor(ExecutorOptions(executor="slurm"))
    assert check_executor(ExecutorOptions(executor="slurm", slurm_cluster="local")).slurm_cluster == "local"


@pytest.mark.parametrize("device, device_map, override, cluster, gpus", [
    ("cpu", None, None, 4, 0.0), ("cuda", None, None, 0, 1.0), ("cuda:1", None, None, 4, 1.0),
    ("auto", "auto", None, 0, 1.0), ("auto", None, None, 8, 1.0), ("auto", None, None, 0, 0.0),
    ("cuda", None, 2, 8, 2.0), ("auto", "auto", 0.5, 8, 0.5),
])
def test_the_gpus_a_plan_asks_for(device, device_map, override, cluster, gpus):
    assert gpus_per_run(device, device_map, override, cluster) == gpus


# ---- a job in its log ----------------------------------------------------------------------------

def test_a_job_runs_with_its_output_in_its_log(tmp_path, capfd):
    outcome = run_job(_jobs(tmp_path, [square, square, square, square])[3])
    assert outcome.ok and outcome.value == 9 and outcome.sentence is None and outcome.seconds >= 0
    log = Path(outcome.log).read_text()
    assert "sinkscope job run3: started" in log and "squaring 3" in log and "finished in" in log
    print("after the job")  # the process's own output is back
    assert "after the job" in capfd.readouterr().out and "after the job" not in Path(outcome.log).read_text()


def test_a_failing_job_is_an_outcome_with_one_sentence_and_its_traceback_in_the_log(tmp_path):
    refused, crashed = (run_job(job) for job in _jobs(tmp_path, [refuse, crash]))
    assert not refused.ok and refused.sentence == "no model at m0; check the path."
    assert refused.failure() == f"run0 failed: no model at m0; check the path (log: {refused.log})"
    assert not crashed.ok and crashed.sentence == "ValueError: bad 1"
    assert "Traceback" in Path(crashed.log).read_text() and "ValueError: bad 1" in Path(crashed.log).read_text()


def test_a_log_is_appended_to_by_a_rerun(tmp_path):
    job = _jobs(tmp_path, [square])[0]
    run_job(job)
    run_job(job)
    assert Path(job.log).read_text().count("sinkscope job run0: started") == 2


def test_progress_counts_done_running_and_failed(tmp_path):
    jobs = _jobs(tmp_path, [square, square, square])
    Path(jobs[2].log).parent.mkdir(parents=True)
    Path(jobs[2].log).write_text("an earlier attempt\n")
    progress = Progress(jobs, "local", show=False)
    assert progress.running() == 0  # a log kept from an earlier attempt is not a running job
    Path(jobs[0].log).write_text("sinkscope job run0: started\n")
    assert progress.running() == 1
    said = []
    progress.finish(Outcome("run0", jobs[0].log, True), said.append)
    progress.finish(Outcome("run1", jobs[1].log, False, "it broke."), said.append)
    assert progress.running() == 0 and progress.failed == 1 and len(progress.finished) == 2
    assert said == [f"run1 failed: it broke (log: {jobs[1].log})"]
    progress.close()


# ---- engines -------------------------------------------------------------------------------------

def test_the_local_engine_runs_every_job_whatever_fails(tmp_path):
    said = []
    outcomes = run_jobs(_jobs(tmp_path, [square, refuse, square]), ExecutorOptions(), tmp_path, log=said.append,
                        show_progress=False)
    assert [o.ok for o in outcomes] == [True, False, True] and [o.value for o in outcomes] == [0, None, 4]
    assert said == [outcomes[1].failure()]
    assert cluster_gpus(ExecutorOptions()) == 0.0


def test_run_local_keeps_the_jobs_order(tmp_path):
    jobs = _jobs(tmp_path, [square, square])
    outcomes = run_local(jobs, ExecutorOptions(), Progress(jobs, "local", show=False), lambda m: None)
    assert [o.name for o in outcomes] == ["run0", "run1"]


class _FakeRay(types.ModuleType):
    """A stand-in for Ray that runs each task when it is submitted (the dispatch, not Ray, is under test)."""

    def __init__(self):
        super().__init__("ray")
        self.initialized, self.inits, self.asked = False, [], []

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.initialized = True
        self.inits.append(kwargs)

    def shutdown(self):
        self.initialized = False

    def cluster_resources(self):
        return {"CPU": 2.0, "GPU": 1.0}

    def remote(self, **_kwargs):
        ray = self

        def wrap(function):
            class Task:
                def options(self, **options):
                    ray.asked.append(options)
                    return self

                def remote(self, *args):
                    return function(*args)  # the "reference" is the result

            return Task()

        return wrap

    def wait(self, pending, num_returns=1, timeout=None):
        return pending[:num_returns], pending[num_returns:]

    def get(self, ref):
        return ref


def test_the_ray_engine_asks_each_jobs_gpus_and_shuts_down_only_what_it_started(tmp_path, monkeypatch):
    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    jobs = [Job(j.name, j.log, j.function, j.args, gpus=g) for j, g in zip(_jobs(tmp_path, [square, refuse]), (1.0, 0.0))]
    outcomes = run_jobs(jobs, ExecutorOptions(executor="ray", ray_address="auto"), tmp_path, log=lambda m: None,
                        show_progress=False)
    assert [o.ok for o in outcomes] == [True, False]
    assert fake.inits == [{"address": "auto", "include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}]
    assert [(a["num_cpus"], a["num_gpus"]) for a in fake.asked] == [(1, 1.0), (1, 0.0)]
    assert not fake.initialized  # started here, shut down here
    fake.initialized = True  # a session the caller holds is used and left running
    outcomes = run_ray(jobs[:1], ExecutorOptions(executor="ray"), Progress(jobs[:1], "ray", show=False), lambda m: None)
    assert outcomes[0].value == 0 and fake.initialized and len(fake.inits) == 1
    assert cluster_gpus(ExecutorOptions(executor="ray")) == 1.0


def test_slurm_parameters_for_an_array_of_runs():
    executor_options = ExecutorOptions(executor="slurm", slurm_partition="gpu", slurm_time=120, slurm_array_parallelism=4)
    assert slurm_parameters(executor_options, 1) == {"timeout_min": 120, "nodes": 1, "tasks_per_node": 1, "cpus_per_task": 4,
                                           "gpus_per_node": 1, "name": "sinkscope", "slurm_array_parallelism": 4,
                                           "slurm_partition": "gpu"}
    assert "slurm_partition" not in slurm_parameters(ExecutorOptions(executor="slurm"), 0)


def test_submitits_debug_executor_runs_the_array_in_this_process(tmp_path):
    pytest.importorskip("submitit")
    executor_options = ExecutorOptions(executor="slurm", slurm_cluster="debug")
    assert type(executor_for(executor_options, tmp_path / "slurm", 0)._executor).__name__ == "DebugExecutor"
    said = []
    outcomes = run_jobs(_jobs(tmp_path, [square, crash]), executor_options, tmp_path, log=said.append, show_progress=False)
    assert [o.ok for o in outcomes] == [True, False] and outcomes[0].value == 0
    assert outcomes[1].sentence == "ValueError: bad 1" and len(said) == 2  # submitted, then the failure


# ---- the comparison's record ---------------------------------------------------------------------

def test_the_comparison_record_round_trips_and_refuses_a_planted_one(tmp_path):
    write_comparison_record(tmp_path, ["a", "b"], ["A", "B"], "variant", False)
    assert read_comparison_record(tmp_path) == {"runs": ["a", "b"], "labels": ["A", "B"], "group_by": "variant",
                                                "series": False}
    assert read_comparison_record(tmp_path / "none") is None
    (tmp_path / "comparison.json").write_text('{"runs": ["../../etc"]}')
    with pytest.raises(SinkscopeError, match="not a comparison's record"):
        read_comparison_record(tmp_path)
    assert phrase("x") == "x"


def test_ctrl_c_while_waiting_on_slurm_names_the_array_to_cancel(tmp_path, monkeypatch):
    import sinkscope.executors.slurm as slurm
    from sinkscope.errors import Interrupted

    class Handle:
        def __init__(self, k):
            self.job_id = f"4242_{k}"

    class Executor:
        def map_array(self, function, jobs, *more):
            return [Handle(k) for k in range(len(jobs))]

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(slurm, "executor_for", lambda executor_options, folder, gpus: Executor())
    monkeypatch.setattr(slurm, "_wait", interrupted)
    jobs = _jobs(tmp_path, [square, square])
    with pytest.raises(Interrupted) as caught:
        slurm.run_slurm(jobs, ExecutorOptions(executor="slurm", slurm_cluster="local"), tmp_path,
                        Progress(jobs, "slurm", show=False), lambda m: None)
    assert "the SLURM array 4242 keeps running" in str(caught.value) and "scancel 4242" in str(caught.value)
    assert caught.value.exit_code == 130


# ---- issue 60: what reaches a batch script or a cluster, and what comes back -----------------------

@pytest.mark.parametrize("given, words", [
    ({"ray_gpus_per_run": float("nan")}, "--ray-gpus-per-run must be a finite number"),
    ({"ray_gpus_per_run": float("inf")}, "--ray-gpus-per-run must be a finite number"),
    ({"slurm_partition": "gpu\nrm -rf ~"}, "--slurm-partition holds the control character '\\n'"),
    ({"slurm_partition": 5}, "--slurm-partition takes a text"),
    ({"slurm_extra": ("slurm_comment=x\necho pwned",)}, "--slurm 'slurm_comment' holds the control character '\\n'"),
    ({"slurm_extra": ("slurm_comment=x\r",)}, "holds the control character '\\r'"),
    ({"slurm_extra": ("slurm_comment=x\u2028y",)}, "holds the control character '\\u2028'"),
    ({"slurm_extra": ("slurm_setup=curl x | sh",)}, "--slurm slurm_setup would put shell commands into the batch"),
    ({"slurm_extra": ("srun_args=--x",)}, "--slurm srun_args would put shell commands"),
    ({"slurm_extra": ("slurm mem=1",)}, "takes a submitit parameter name"),
    ({"slurm_extra": "slurm_mem=1"}, "--slurm takes a list of key=value texts"),
    ({"ray_address": "garbage"}, "--ray-address 'garbage' is not a Ray address; use auto, HOST:PORT"),
    ({"ray_address": "http://[::1"}, "--ray-address 'http://[::1' is not a Ray address"),
    ({"ray_address": "host:²"}, "is not a Ray address"),
    ({"ray_address": "host:0"}, "has the port 0"),
    ({"ray_address": "host:65536"}, "has the port 65536"),
    ({"ray_address": "[nonsense]:6379"}, "has no IPv6 address between its brackets"),
    ({"ray_address": "host:6379\n"}, "--ray-address holds the control character '\\n'"),
])
def test_what_would_reach_a_batch_script_or_a_cluster_is_checked(given, words):
    with pytest.raises(SinkscopeError) as caught:
        check_executor(ExecutorOptions(**given))
    assert words in str(caught.value) and str(caught.value).count(". ") == 0


@pytest.mark.parametrize("address", ["auto", "127.0.0.1:6379", "[::1]:6379", "ray://head.example:10001", "head-1:1"])
def test_the_ray_addresses_ray_takes_are_taken(address):
    assert check_executor(ExecutorOptions(ray_address=address)).ray_address == address


def test_slurm_values_are_numbers_only_when_int_reads_them():
    from sinkscope.executors.settings import slurm_value

    assert slurm_value(" 12 ") == 12 and slurm_value("²") == "²" and slurm_value("64G") == "64G"
    params = slurm_parameters(ExecutorOptions(slurm_extra=("slurm_mem_gb=²", "slurm_nice=5")), 0)
    assert params["slurm_mem_gb"] == "²" and params["slurm_nice"] == 5


def test_a_parameter_submitit_refuses_is_one_sentence(tmp_path):
    pytest.importorskip("submitit")
    executor_options = ExecutorOptions(executor="slurm", slurm_cluster="local", slurm_extra=("mem_gb=lots",))
    with pytest.raises(SinkscopeError, match=r"submitit refused the SLURM parameters .*check --slurm"):
        executor_for(executor_options, tmp_path, 0)


def test_a_submitit_folder_with_a_control_character_is_refused(tmp_path):
    from sinkscope.executors.slurm import submission_folder

    with pytest.raises(SinkscopeError, match="holds the control character '\\\\n'"):
        submission_folder(tmp_path / "runs\n#SBATCH --x")
    assert not (tmp_path / "runs\n#SBATCH --x").exists()


def test_each_submission_gets_a_fresh_folder_of_its_own(tmp_path):
    from sinkscope.executors.slurm import submission_folder

    first, second = submission_folder(tmp_path / "slurm"), submission_folder(tmp_path / "slurm")
    assert first != second and first.parent == second.parent == tmp_path / "slurm"
    assert first.is_dir() and not any(first.iterdir())


def test_an_outcome_comes_back_only_as_the_json_this_submission_asked_for(tmp_path):
    import json

    from sinkscope.executors.slurm import outcome_path, read_outcome, slurm_task

    job = _jobs(tmp_path, [square])[0]
    path = outcome_path(tmp_path, 0, "n0nce")
    slurm_task(job, str(path), "n0nce")
    outcome = read_outcome(job, path, "n0nce")
    assert outcome.ok and outcome.value == 0 and outcome.name == "run0" and outcome.log == job.log
    assert read_outcome(job, path, "another") is None  # a file from another submission
    other = Job("run9", job.log, square, (0,))
    assert read_outcome(other, path, "n0nce") is None  # another job's
    record = json.loads(path.read_text())
    for planted in ({**record, "ok": "yes"}, {**record, "ok": False, "sentence": None}, [record], "x"):
        path.write_text(json.dumps(planted))
        assert read_outcome(job, path, "n0nce") is None
    path.write_bytes(b"\x80\x04not json")  # a pickle where the JSON should be is not read as one
    assert read_outcome(job, path, "n0nce") is None
    assert read_outcome(job, tmp_path / "none.json", "n0nce") is None
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, replaced


def unjsonable(x: int) -> object:
    return {1, 2}


def test_a_value_json_cannot_carry_is_a_failed_outcome(tmp_path):
    from sinkscope.executors.slurm import outcome_path, read_outcome, slurm_task

    job = _jobs(tmp_path, [unjsonable])[0]
    path = outcome_path(tmp_path, 0, "n")
    slurm_task(job, str(path), "n")
    outcome = read_outcome(job, path, "n")
    assert not outcome.ok and "cannot be sent back as JSON" in outcome.sentence


def test_a_task_done_without_its_outcome_is_lost_and_its_result_pickle_never_read(tmp_path):
    import sinkscope.executors.slurm as slurm

    class Handle:
        job_id = "77_0"
        paths = types.SimpleNamespace(stderr=tmp_path / "77_0_0_log.err")

        def done(self):
            return True

        def result(self):  # submitit's: would unpickle <id>_0_result.pkl
            raise AssertionError("the result pickle was read")

    jobs = _jobs(tmp_path, [square])
    said = []
    outcomes = slurm._wait(jobs, [Handle()], [tmp_path / "outcome-0-n.json"], "n", Progress(jobs, "slurm", show=False),
                           said.append)
    assert not outcomes[0].ok and "ended without an outcome" in outcomes[0].sentence
    assert f"submitit's log: {tmp_path / '77_0_0_log.err'}" in outcomes[0].sentence and len(said) == 1


def test_the_debug_executors_runs_come_back_as_json_in_a_fresh_folder(tmp_path):
    pytest.importorskip("submitit")
    executor_options = ExecutorOptions(executor="slurm", slurm_cluster="debug")
    for _ in range(2):
        outcomes = run_jobs(_jobs(tmp_path, [square, refuse]), executor_options, tmp_path, log=lambda m: None, show_progress=False)
        assert [o.ok for o in outcomes] == [True, False] and outcomes[0].value == 0
    folders = sorted((tmp_path / "slurm").iterdir())
    assert len(folders) == 2 and all(len(list(folder.glob("outcome-*.json"))) == 2 for folder in folders)


# ---- issue 60: Ray's address, said in one sentence ---------------------------------------------------

def _listener(answer: bytes | None):
    """A TCP server on 127.0.0.1 that answers each connection with ``answer`` (None: closes it at once);
    its port and a function that stops it."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(5)

    def serve():
        try:
            while True:
                connection, _ = server.accept()
                if answer is not None:
                    connection.sendall(answer)
                connection.close()
        except OSError:
            return

    threading.Thread(target=serve, daemon=True).start()
    return server.getsockname()[1], server.close


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_address_where_nothing_answers_is_one_sentence_before_ray_starts(monkeypatch):
    import time

    from sinkscope.executors.ray_tasks import connect

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    started = time.monotonic()
    with pytest.raises(SinkscopeError) as caught:
        connect(ExecutorOptions(executor="ray", ray_address=f"127.0.0.1:{_closed_port()}"))
    assert time.monotonic() - started < 30 and not fake.inits
    assert "no Ray cluster answers at 127.0.0.1:" in str(caught.value) and "--ray-address" in str(caught.value)


def test_an_address_where_something_else_answers_is_one_sentence(monkeypatch):
    from sinkscope.executors.ray_tasks import connect

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port, stop = _listener(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    try:
        with pytest.raises(SinkscopeError, match="is not a Ray cluster"):
            connect(ExecutorOptions(executor="ray", ray_address=f"127.0.0.1:{port}"))
    finally:
        stop()
    assert not fake.inits


def test_a_grpc_server_is_joined_and_the_commands_sigterm_handler_is_put_back(monkeypatch):
    import signal

    from sinkscope.executors.ray_tasks import connect

    class SignalTakingRay(_FakeRay):
        def init(self, **kwargs):  # as ray.init does: its own SIGTERM handler
            signal.signal(signal.SIGTERM, lambda *a: None)
            super().init(**kwargs)

    fake = SignalTakingRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port, stop = _listener(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))  # an HTTP/2 SETTINGS frame, as gRPC answers

    def ours(*args):
        pass

    before = signal.signal(signal.SIGTERM, ours)
    try:
        assert connect(ExecutorOptions(executor="ray", ray_address=f"127.0.0.1:{port}")) is True
        assert signal.getsignal(signal.SIGTERM) is ours and fake.inits[0]["address"] == f"127.0.0.1:{port}"
    finally:
        signal.signal(signal.SIGTERM, before)
        stop()


def test_ray_finding_no_cluster_is_said_as_such_not_as_a_disk_failure(monkeypatch):
    from sinkscope.executors.ray_tasks import connect

    class NoCluster(_FakeRay):
        def init(self, **kwargs):
            raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setitem(sys.modules, "ray", NoCluster())
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(SinkscopeError) as caught:
        connect(ExecutorOptions(executor="ray", ray_address="auto"))
    assert str(caught.value).startswith("no Ray cluster is running on this machine")
    assert "`ray start --head`" in str(caught.value) and "could not write" not in str(caught.value)


def test_a_malformed_ray_address_in_the_environment_is_named(monkeypatch):
    from sinkscope.executors.ray_tasks import connect

    fake = _FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("RAY_ADDRESS", "garbage")
    with pytest.raises(SinkscopeError, match="the RAY_ADDRESS environment variable 'garbage' is not a Ray address"):
        connect(ExecutorOptions(executor="ray"))
    assert not fake.inits


def test_a_ray_task_name_shows_control_characters_as_escapes():
    from sinkscope.executors.ray_tasks import _task_name

    assert _task_name(Job("a\nb", "x.log", square)) == "sinkscope:a\\nb"
    assert _task_name(Job("cmp/alpha", "x.log", square)) == "sinkscope:cmp/alpha"


def test_how_a_process_ended_is_said():
    from sinkscope.executors.local import _how_it_ended

    assert _how_it_ended(-9).startswith("killed by SIGKILL; the system's out-of-memory killer")
    assert _how_it_ended(-15) == "killed by SIGTERM" and _how_it_ended(3) == "exit code 3"
