import json
import subprocess
import sys

import pytest

from planner.cli import main
from planner.inputs.job import load_job
from planner.plan.document import read_plan
from planner.plan.plan import validate_plan

from conftest import ROOT, SHIPPED, small_topology


def test_plan_prints_degrees_table_prediction_and_memory(write_yaml, capsys, tmp_path):
    path = write_yaml(small_topology())
    assert main([str(path), "-o", str(tmp_path / "plan.yaml")]) == 0
    out = capsys.readouterr().out
    for fragment in ("Degrees:", "replica", "stage 0", "Predicted iteration time", "compute", "bubble",
                     "gradient sync", "tokens/s", "MFU", "Lower bound", "Memory", "Plan written"):
        assert fragment in out
    plan, _ = read_plan(tmp_path / "plan.yaml")
    job = load_job(path)
    validate_plan(plan, job.topology, job.model, job.training)


def test_small_topologies_get_cpsat_proofs_unless_told_not_to(write_yaml, capsys, tmp_path):
    path = write_yaml(small_topology())
    assert main([str(path), "-o", str(tmp_path / "plan.yaml")]) == 0
    assert "CP-SAT, " in capsys.readouterr().out
    plan, _ = read_plan(tmp_path / "plan.yaml")
    shapes = plan.search["exact"]
    assert shapes and all(s["status"] in ("optimal", "feasible", "infeasible", "unknown") for s in shapes)
    assert any(s["status"] == "optimal" and s["estimate_s"] >= s["bound_s"] for s in shapes)
    assert main([str(path), "--no-exact"]) == 0
    assert "CP-SAT, " not in capsys.readouterr().out


def test_format_json_prints_the_plan_document(write_yaml, capsys):
    assert main([str(write_yaml(small_topology())), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["degrees"]["pipeline"] * document["degrees"]["data"] <= 4 and document["degrees"]["tensor"] == 1
    assert document["prediction"]["iteration_s"] > 0


def test_model_and_batch_overrides(write_yaml, capsys):
    doc = small_topology()
    doc.pop("model")
    doc.pop("training")
    assert main([str(write_yaml(doc)), "--model", "tiny", "--global-batch", "8", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["global_batch"] == 8


@pytest.mark.parametrize("args, fragment", [
    (["missing.yaml"], "file not found"),
    (["{topo}", "--model", "gpt5"], "unknown model preset"),
    (["{topo}", "--global-batch", "0"], "--global-batch"),
    (["{topo}", "--time-limit", "-1"], "--time-limit"),
    (["{topo}", "-o", "plan.txt"], "name the file .yaml or .json"),
    (["{topo}", "--micro-batch-size", "3"], "not a multiple"),
])
def test_user_mistakes_exit_2_with_one_line(write_yaml, capsys, args, fragment):
    topo = str(write_yaml(small_topology()))
    assert main([a.format(topo=topo) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert fragment in err and "\n" not in err and "Traceback" not in err


def test_model_that_cannot_fit_anywhere_exits_2(write_yaml, capsys):
    doc = small_topology(model="gpt3-13b")
    doc["training"]["global_batch"] = 16
    assert main([str(write_yaml(doc)), "--time-limit", "5"]) == 2
    assert "no plan fits in memory" in capsys.readouterr().err


def test_console_script_runs_without_torch(write_yaml):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from planner.cli import main\n"
            f"raise SystemExit(main([{str(write_yaml(small_topology()))!r}, '--format', 'json']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_every_shipped_topology_plans_validly(path, tmp_path, capsys):
    assert main([str(path), "-o", str(tmp_path / "plan.json"), "--time-limit", "20"]) == 0
    plan, _ = read_plan(tmp_path / "plan.json")
    job = load_job(path)
    validate_plan(plan, job.topology, job.model, job.training)


@pytest.mark.slow
def test_objective_dtfm_reports_dtfms_cost_and_a_valid_plan(tmp_path, capsys):
    out = tmp_path / "dtfm.json"
    case5 = ROOT / "topologies" / "dtfm" / "case5-worldwide.yaml"
    code = main([str(case5), "--objective", "dtfm", "--stages", "8", "--replicas", "8", "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "DTFM objective: 49.218 s (COST_DP 22.758 s + 2 x COST_PP 13.230 s)" in text
    document = json.loads(out.read_text())
    assert document["search"]["algorithm"] == "dtfm-objective"
    assert {len(range(*s["layers"])) for s in document["stages"]} == {3}  # even layers
    assert {r["micro_batches"] for r in document["replicas"]} == {128}  # even batch


def test_objective_dtfm_that_does_not_fit_is_one_line(write_yaml, capsys):
    doc = small_topology(training={"global_batch": 64, "micro_batch_size": 8, "schedule": "gpipe", "precision": "auto"},
                         model="gpt3-xl")
    code = main([str(write_yaml(doc)), "--objective", "dtfm"])
    err = capsys.readouterr().err
    assert code == 2 and "DTFM ignores memory" in err and len(err.strip().splitlines()) == 1


def test_progress_bar_only_on_a_terminal_after_a_second(monkeypatch, capsys):
    from planner import cli

    progress = cli._Progress(10.0)
    progress.clock = lambda: progress.started + 5.0
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: False)
    progress({"evaluations": 3, "best_s": 1.5, "phase": "construct"})
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli.sys.stderr, "isatty", lambda: True)
    progress({"evaluations": 3, "best_s": 1.5, "phase": "construct"})
    progress.close()
    err = capsys.readouterr().err
    assert "[##########----------]" in err and "3 candidates, best 1.500 s" in err and err.endswith("\n")


def test_options_may_come_before_the_topology(write_yaml, tmp_path, capsys):
    topo, out = str(write_yaml(small_topology())), tmp_path / "plan.yaml"
    assert main(["-o", str(out), "--no-exact", "--time-limit", "5", topo]) == 0
    assert "CP-SAT, " not in capsys.readouterr().out
    plan, _ = read_plan(out)
    job = load_job(topo)
    validate_plan(plan, job.topology, job.model, job.training)
    assert main(["--format", "json", topo]) == 0
    assert json.loads(capsys.readouterr().out)["format_version"] == 1


def test_version_is_the_installed_package_version(capsys, monkeypatch):
    import importlib.metadata

    import planner

    assert planner.__version__ == importlib.metadata.version("hetplan")
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"plan (hetplan) {planner.__version__}"

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert planner.__version__ == "0+unknown"


def test_python_dash_m_planner_is_the_plan_command(write_yaml):
    version = subprocess.run([sys.executable, "-m", "planner", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "plan (hetplan) " in version.stdout
    topo = str(write_yaml(small_topology()))
    result = subprocess.run([sys.executable, "-m", "planner", "--format", "json", "--no-exact", topo],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["degrees"]["tensor"] == 1
    bad = subprocess.run([sys.executable, "-m", "planner", topo, "--seed", "-5"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--seed" in bad.stderr


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("args, fragment", [
    (["--seed", "-5"], "'--seed': must be 0 or more"),
    (["--time-limit", "nan"], "'--time-limit': must be a finite number"),
    (["--time-limit", "inf"], "'--time-limit': must be a finite number"),
    (["--time-limit", "0"], "'--time-limit': must be a finite number"),
])
def test_bad_numbers_on_the_command_line_are_refused(write_yaml, capsys, args, fragment):
    assert main([str(write_yaml(small_topology())), *args]) == 2
    assert fragment in _one_line(capsys)


def test_launch_refuses_non_finite_seconds_before_reading_the_plan(capsys):
    assert main(["launch", "missing.yaml", "--timeout", "nan"]) == 2
    assert "'--timeout': must be a finite number" in _one_line(capsys)
    assert main(["launch", "missing.yaml", "--seed", "-1"]) == 2
    assert "'--seed'" in _one_line(capsys)


def _leftovers(folder) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def test_output_naming_a_folder_or_a_missing_folder_is_one_line(write_yaml, tmp_path, capsys):
    topo = str(write_yaml(small_topology()))
    folder = tmp_path / "plans.yaml"
    folder.mkdir()
    assert main([topo, "-o", str(folder)]) == 2
    err = _one_line(capsys)
    assert str(folder) in err and "'--output': is a folder: name a file in it" in err
    assert main([topo, "-o", str(tmp_path / "missing" / "plan.yaml")]) == 2
    assert "does not exist: create it first" in _one_line(capsys)
    assert _leftovers(tmp_path) == [] and list(folder.iterdir()) == []


def test_output_naming_an_input_is_refused_and_the_input_kept(write_yaml, tmp_path, capsys):
    """-o over the topology, the old plan, the added devices or the calibration would replace the
    user's file with the plan: one line naming --output, exit 2, every input as it was."""
    from pathlib import Path

    topo = write_yaml(small_topology())
    before = Path(topo).read_bytes()
    for output in (str(topo), str(Path(topo).resolve()), f"{Path(topo).parent}/./{Path(topo).name}"):
        assert main([str(topo), "-o", output, "--time-limit", "5"]) == 2
        err = _one_line(capsys)
        assert "'--output'" in err and "one of this command's inputs" in err, err
    assert Path(topo).read_bytes() == before
    old = tmp_path / "old.yaml"
    assert main([str(topo), "-o", str(old), "--time-limit", "5"]) == 0
    capsys.readouterr()
    plan_bytes = old.read_bytes()
    lost = read_plan(old)[0].assignment[0][0]
    for args in ([str(topo), "--from", str(old), "-o", str(old)],
                 [str(topo), "--from", str(old), "--lost", lost, "-o", str(old)],
                 [str(topo), "--from", str(old), "--lost", lost, "-o", str(topo)]):
        assert main([*args, "--time-limit", "5"]) == 2
        assert "one of this command's inputs" in _one_line(capsys)
    assert old.read_bytes() == plan_bytes and Path(topo).read_bytes() == before
    # the front's files, PLAN-pareto-K.yaml, may not replace an input either
    front = tmp_path / "p-pareto-2.yaml"
    front.write_bytes(before)
    assert main([str(front), "--pareto", "-o", str(tmp_path / "p.yaml"), "--time-limit", "5"]) == 2
    err = _one_line(capsys)
    assert "'--pareto'" in err and "one of this command's inputs" in err, err
    assert front.read_bytes() == before
    pytest.importorskip("torch")  # plan calibrate checks its -o before it measures anything
    assert main(["calibrate", str(topo), "-o", str(topo)]) == 2
    assert "one of this command's inputs" in _one_line(capsys) and Path(topo).read_bytes() == before


def test_output_in_a_read_only_folder_is_refused_before_the_search(write_yaml, tmp_path, capsys, monkeypatch):
    import errno
    import tempfile

    from planner.search import front

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    searched = []
    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(front, "search", lambda *a, **k: searched.append(1))
    out = tmp_path / "plan.yaml"
    assert main([str(write_yaml(small_topology())), "-o", str(out)]) == 2
    err = _one_line(capsys)
    assert str(out) in err and "'--output': cannot write in" in err and "Read-only file system" in err
    assert searched == [] and not out.exists() and _leftovers(tmp_path) == []


def test_full_disk_while_writing_the_plan_loses_nothing(write_yaml, tmp_path, capsys, monkeypatch):
    import errno

    from planner import io

    out = tmp_path / "plan.yaml"
    out.write_text("the plan written yesterday\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(io.os, "fsync", full)
    assert main([str(write_yaml(small_topology())), "-o", str(out), "--no-exact", "--time-limit", "5"]) == 2
    err = _one_line(capsys)
    assert str(out) in err and "No space left on device" in err and "nothing was written" in err
    assert out.read_text() == "the plan written yesterday\n" and _leftovers(tmp_path) == []


def test_launch_from_another_folder_names_the_plans_topology_path(write_yaml, tmp_path, capsys, monkeypatch):
    """A plan records its topology's path as given to 'plan'; launched from elsewhere, with the
    topology neither there nor beside the plan, one line names topology.path and --topology."""
    topo = write_yaml(small_topology())
    monkeypatch.chdir(topo.parent)
    (tmp_path / "sub").mkdir()
    plan = tmp_path / "sub" / "p.yaml"
    assert main([topo.name, "-o", str(plan), "--time-limit", "5"]) == 0
    capsys.readouterr()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["launch", str(plan), "--emulate"]) == 2
    err = _one_line(capsys)
    assert "'topology.path'" in err and f"names {topo.name}" in err and "--topology" in err, err


def test_a_topology_given_as_a_plan_or_a_calibration_says_which_file_it_is(write_yaml, capsys):
    topo = str(write_yaml(small_topology()))
    assert main(["launch", topo]) == 2
    err = _one_line(capsys)
    assert "'format_version'" in err and "is a topology file, not a plan" in err, err
    assert main([topo, "--calibration", topo, "--time-limit", "5"]) == 2
    err = _one_line(capsys)
    assert "'format'" in err and "is a topology file, not a calibration" in err, err


@pytest.mark.parametrize("args, option", [(["--stages", "abc"], "--stages"), (["--global-batch", "64.5"], "--global-batch"),
                                          (["--schedule", "zigzag"], "--schedule")])
def test_a_bad_option_value_is_one_line(write_yaml, capsys, args, option):
    topo = str(write_yaml(small_topology()))
    with pytest.raises(SystemExit) as exit_:
        main([topo, *args])
    assert exit_.value.code == 2
    err = _one_line(capsys)
    assert f"argument {option}" in err and "'plan make -h' lists the options" in err, err


def test_a_closed_stdout_pipe_ends_quietly(write_yaml, tmp_path):
    """'plan TOPO | head' whose reader has gone: no traceback, the plan file still written."""
    topo = str(write_yaml(small_topology()))
    out = tmp_path / "p.yaml"
    process = subprocess.Popen([sys.executable, "-m", "planner", topo, "--budget", "1", "-o", str(out)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    process.stdout.close()  # the reader goes away before the report is printed
    err = process.stderr.read().decode()
    assert process.wait() in (0, 141) and "Traceback" not in err and "Exception ignored" not in err, err
    assert out.exists()


def test_launch_of_a_plan_whose_topology_was_deleted_names_topology_path(write_yaml, tmp_path, capsys):
    """A plan made from an absolute topology path that no longer exists: one line naming
    topology.path and --topology (it said only 'file not found')."""
    topo = write_yaml(small_topology())
    plan = tmp_path / "p.yaml"
    assert main([str(topo.resolve()), "-o", str(plan), "--time-limit", "5"]) == 0
    capsys.readouterr()
    topo.unlink()
    assert main(["launch", str(plan), "--emulate"]) == 2
    err = _one_line(capsys)
    assert "'topology.path'" in err and "no longer exists" in err and "--topology" in err, err


def test_plot_of_a_plan_file_says_what_it_reads(write_yaml, tmp_path, capsys):
    plan = tmp_path / "p.yaml"
    assert main([str(write_yaml(small_topology())), "-o", str(plan), "--time-limit", "5"]) == 0
    capsys.readouterr()
    assert main(["plot", str(plan)]) == 2
    err = _one_line(capsys)
    assert "not a results file" in err and "plan launch --out" in err, err


def test_time_under_budget_without_a_budget_says_it_is_missing(write_yaml, capsys):
    assert main([str(write_yaml(small_topology())), "--objective", "time-under-budget"]) == 2
    err = _one_line(capsys)
    assert "'--budget-usd-per-iteration'" in err and "is missing" in err and "None" not in err, err
