"""preclint's GitHub Action: action.yml is a composite action whose steps run
scripts/github_action.py with its inputs as environment variables; the workflows in the docs use the
inputs it has; and the steps themselves, run here as the runner runs them (its environment variables,
a pull request's event, a clean virtual environment), check a sample repository's changed files, and
never import a pull request's files (an argparse.py, a preclint/ package, a sitecustomize.py on the
job's PYTHONPATH) in any Python they start."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import sysconfig

import jsonschema
import pytest
import yaml
from packaging.requirements import Requirement

from tests.paths import DATA, ROOT

ACTION = yaml.safe_load((ROOT / "action.yml").read_text(encoding="utf-8"))
SCRIPT = ROOT / "scripts" / "github_action.py"
INPUTS = {"install", "paths", "args", "fail-on", "models", "report"}
AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n"


def _script():
    spec = importlib.util.spec_from_file_location("preclint_scripts_github_action", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_action_is_composite_with_the_documented_inputs_and_outputs():
    assert ACTION["name"] == "preclint" and ACTION["description"]
    assert set(ACTION["inputs"]) == INPUTS
    for name, spec in ACTION["inputs"].items():
        assert spec["description"] and "default" in spec and spec["required"] is False, name
    assert ACTION["inputs"]["install"]["default"] == "source" and ACTION["inputs"]["report"]["default"] == "annotations"
    steps = ACTION["runs"]["steps"]
    assert ACTION["runs"]["using"] == "composite"
    ids = {step.get("id") for step in steps}
    for output in ACTION["outputs"].values():
        (step_id,) = re.findall(r"steps\.([\w-]+)\.outputs", output["value"])
        assert step_id in ids


def test_the_steps_run_the_script_with_inputs_as_environment_never_in_the_shell_line():
    parser_steps = set()
    for step in ACTION["runs"]["steps"]:
        if "run" not in step:
            continue
        assert step["shell"] == "bash"
        assert "${{" not in step["run"], step["name"]  # an input or a file name would become shell code
        for name, value in (step.get("env") or {}).items():
            if name.startswith("INPUT_"):
                assert value == "${{ inputs.%s }}" % name[6:].lower().replace("_", "-")
        match = re.search(r'\)" (-I )?"\$GITHUB_ACTION_PATH/scripts/github_action\.py" (\w+)', step["run"])
        if match:
            assert match.group(1), step["run"]  # isolated: a checkout's json.py on PYTHONPATH is not the action's
            parser_steps.add(match.group(2))
    assert parser_steps == {"install", "paths", "check"}
    # every input the script reads is passed to the step that reads it
    source = SCRIPT.read_text(encoding="utf-8")
    read = set(re.findall(r'_input\("([\w-]+)"', source))
    assert read == INPUTS
    passed = {name[6:].lower().replace("_", "-") for step in ACTION["runs"]["steps"] for name in step.get("env") or {}
              if name.startswith("INPUT_")}
    assert passed == INPUTS


def test_the_sarif_upload_runs_only_for_a_sarif_report_and_before_the_exit():
    steps = ACTION["runs"]["steps"]
    (upload,) = [s for s in steps if str(s.get("uses", "")).startswith("github/codeql-action/upload-sarif@")]
    assert "inputs.report == 'sarif'" in upload["if"]
    assert upload["with"]["sarif_file"] == "${{ steps.check.outputs.report-file }}"
    assert steps.index(upload) == len(steps) - 2 and "exit" in steps[-1]["run"]


def test_the_action_installs_what_the_source_hook_installs():
    hooks = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    hook = [str(Requirement(text)) for text in hooks["preclint-source"]["additional_dependencies"][1:]]
    lines = (ROOT / "scripts" / "action-source-requirements.txt").read_text().splitlines()
    action = [str(Requirement(line)) for line in lines if line.strip() and not line.startswith("#")]
    assert action == hook


def _workflow_steps(path):
    for block in re.findall(r"```yaml\n(.*?)```", path.read_text(encoding="utf-8"), re.S):
        document = yaml.safe_load(block)
        for job in (document or {}).get("jobs", {}).values():
            yield from job.get("steps", [])


@pytest.mark.parametrize("page", ["README.md", "docs/ci.md"])
def test_the_documented_workflows_use_inputs_the_action_has(page):
    uses = [step for step in _workflow_steps(ROOT / page) if re.search(r"/preclint@", str(step.get("uses", "")))]
    assert uses, page
    for step in uses:
        given = step.get("with") or {}
        assert set(given) <= INPUTS, step
        assert given.get("report", "annotations") in ("annotations", "sarif", "rdjson")
        assert given.get("install", "source") in ("source", "full")
        assert "models" not in given or given.get("install") == "full"


def test_paths_are_shell_words_and_models_one_a_line(monkeypatch):
    action = _script()
    monkeypatch.delenv("GITHUB_EVENT_NAME", raising=False)
    assert action.select_paths("src 'my file.py'", "annotations") == ["src", "my file.py"]
    assert action.select_paths("", "annotations") == ["."]
    assert action.model_runs("a.py --model Net\n\n# later\n b.py --input 1x8") == [["a.py", "--model", "Net"],
                                                                                   ["b.py", "--input", "1x8"]]


def test_the_action_installs_its_own_copy_isolated_and_outside_the_checkout(monkeypatch, tmp_path):
    """Both installs give pip the action's own copy (never a name a package index resolves), run pip
    with -I from the runner's temporary directory, and keep the job's PYTHONPATH from what pip starts."""
    action = _script()
    commands = []
    monkeypatch.setattr(action.subprocess, "run", lambda command, **kw: commands.append((command, kw)))
    monkeypatch.setattr(action.venv, "EnvBuilder", lambda **kw: type("B", (), {"create": lambda self, d: None})())
    monkeypatch.setenv("RUNNER_TEMP", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("GITHUB_EVENT_NAME", raising=False)
    monkeypatch.chdir(ROOT)
    action.install("source", "")
    action.install("full", "net.py")
    assert len(commands) == 2
    for command, kw in commands:
        assert command[1:5] == ["-I", "-m", "pip", "install"] and str(ROOT) in command
        assert not [word for word in command if word.lower().startswith("preclint")]  # no name, no pin by name
        assert kw["cwd"] == tmp_path and "PYTHONPATH" not in kw["env"]
    assert os.getcwd() == str(tmp_path)


@pytest.mark.parametrize("inputs, line", [
    ({"paths": "src 'my file.py"}, "paths: No closing quotation in \"src 'my file.py\""),
    ({"args": "--select 'PCL5"}, "args: No closing quotation in \"--select 'PCL5\""),
    ({"models": "net.py\nb.py --model \"Net"}, "models, line 2: No closing quotation in 'b.py --model \"Net'"),
])
@pytest.mark.subprocess
def test_an_unbalanced_quote_in_an_input_is_one_error_line(pull_request, inputs, line):
    step = "paths" if "paths" in inputs else "check"
    (pull_request.parent / "runner" / "preclint-paths.json").write_text('["new.py"]')
    done, outputs = _step(pull_request, step, *(["--python", sys.executable] if step == "check" else []), **inputs)
    assert (done.returncode, done.stdout, done.stderr) == (2, f"::error title=preclint action::{line}\n", "")
    assert outputs == {}


def test_what_pull_request_target_refuses_and_what_an_event_cannot_smuggle(monkeypatch, tmp_path):
    action = _script()
    monkeypatch.setenv("GITHUB_EVENT_NAME", "pull_request_target")
    for kind, models in (("full", ""), ("full", "net.py")):  # the job's Python and the models run its code
        with pytest.raises(action.ActionError, match="pull_request_target"):
            action.install(kind, models)
    with pytest.raises(action.ActionError, match="as the base branch's"):  # its alerts would be the base's
        action.check(sys.executable, ["."], args="", fail_on="", models="", report="sarif")
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"base": {"sha": "--upload-pack=touch /tmp/x"}}}))
    monkeypatch.setenv("GITHUB_EVENT_PATH", str(event))
    with pytest.raises(action.ActionError, match="not a commit"):
        action.select_paths("", "annotations")


# ---- the steps, run as the runner runs them ------------------------------------------------------------

def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
                   check=True, capture_output=True)


# A pull request's files that run when Python imports them (from the working directory, PYTHONPATH or
# the user's site-packages), each leaving its name in the markers directory; a preclint/ package and a
# pip/ package whose __main__ ends at once with exit 0, as a forged verdict and a forged install would.
HOSTILE = ("argparse.py", "json.py", "re.py", "enum.py", "libcst.py", "rich/__init__.py", "sitecustomize.py",
           "preclint/__init__.py", "preclint/__main__.py", "pip/__init__.py", "pip/__main__.py", "setuptools.py")


def _plant(repo):
    """The hostile files in ``repo``, and the job environment that puts them in Python's way: PYTHONPATH on
    the checkout (common in CI), a user base in it with a usercustomize.py. Returns that environment."""
    markers = repo.parent / "markers"
    markers.mkdir(exist_ok=True)
    userbase = repo / ".userbase"
    user_site = sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": str(userbase)})
    for name in (*HOSTILE, os.path.join(os.path.relpath(user_site, repo), "usercustomize.py")):
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        stop = "raise SystemExit(0)\n" if name.endswith("__main__.py") else ""
        path.write_text(f"open({str(markers / os.path.basename(os.path.dirname(name) or name))!r}, 'a').close()\n{stop}")
    return {"PYTHONPATH": str(repo), "PYTHONUSERBASE": str(userbase)}


def _ran(repo):
    return sorted(os.listdir(repo.parent / "markers"))


def _pull_request(tmp_path, hostile=False):
    """A repository whose pull request changes two files with a finding (one named with a leading dash
    and a space) and one without, over a base whose own finding is not the pull request's; ``hostile``:
    it adds the files of HOSTILE too."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "old.py").write_text(AMP)
    (repo / "clean.py").write_text("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    (repo / "new.py").write_text(AMP)
    (repo / "- dash me.py").write_text(AMP)
    (repo / "clean.py").write_text("x = 1\ny = 2\n")
    (repo / "net.py").write_text("import torch\n\nmodel = torch.nn.Linear(4, 4)\nexample_inputs = (torch.ones(2, 4),)\n")
    job = _plant(repo) if hostile else {}
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "the pull request")
    (tmp_path / "event.json").write_text(json.dumps({"pull_request": {"base": {"sha": base}}}))
    (tmp_path / "runner").mkdir()
    return repo, job


@pytest.fixture
def pull_request(tmp_path):
    return _pull_request(tmp_path)[0]


def _step(repo, name, *args, job=None, **inputs):
    """The action's step ``name`` as the runner runs it (python -I, the checkout as working directory),
    with ``job``'s variables (PYTHONPATH, ...) in the job's environment."""
    python = inputs.pop("runner_python", sys.executable)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH" and not key.startswith("INPUT_")}
    env.update({"GITHUB_EVENT_NAME": "pull_request", "GITHUB_EVENT_PATH": str(repo.parent / "event.json"),
                "GITHUB_OUTPUT": str(repo.parent / "output"), "RUNNER_TEMP": str(repo.parent / "runner"),
                "PRECLINT_CACHE_DIR": str(repo.parent / "cache"), **(job or {})})
    env.update({f"INPUT_{key.upper()}": value for key, value in inputs.items()})
    (repo.parent / "output").write_text("")
    done = subprocess.run([python, "-I", str(SCRIPT), name, *args], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    outputs = dict(line.split("=", 1) for line in (repo.parent / "output").read_text().splitlines())
    return done, outputs


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The source install (pip builds preclint and fetches its few packages), once for this module's step
    tests, as a pull request's job runs it: in a checkout full of HOSTILE files, PYTHONPATH on it.
    Returns the Python that runs preclint."""
    repo, job = _pull_request(tmp_path_factory.mktemp("install"), hostile=True)
    done, outputs = _step(repo, "install", job=job)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _ran(repo) == []  # neither the action, nor venv's ensurepip, nor pip, nor its build ran them
    python = outputs["python"]
    assert python.startswith(str(repo.parent / "runner" / "preclint-venv"))
    found = subprocess.run([python, "-c", "import importlib.util as u; print([m for m in ('torch', 'torchvision', "
                            "'plotly', 'numpy') if u.find_spec(m)])"], capture_output=True, text=True)
    assert found.stdout.strip() == "[]", found  # the source side alone: no torch
    return python


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_steps_check_a_pull_request_from_a_clean_environment(pull_request, installed):
    """One test, as the steps take minutes."""
    repo, python = pull_request, installed
    done, _ = _step(repo, "paths")
    assert json.loads((repo.parent / "runner" / "preclint-paths.json").read_text()) == ["- dash me.py", "clean.py", "net.py", "new.py"]
    done, outputs = _step(repo, "check", "--python", python)
    annotations = [line for line in done.stdout.splitlines() if line.startswith("::warning ")]
    assert [line.split(",")[0] for line in annotations] == ["::warning file=- dash me.py", "::warning file=new.py"]
    assert done.returncode == 0 and outputs["exit-code"] == "1"  # the last step ends with it
    done, outputs = _step(repo, "check", "--python", python, fail_on="error")
    assert outputs["exit-code"] == "0", done.stdout + done.stderr  # PCL502 is a warning

    # code scanning compares whole analyses: the whole checkout, one run with its category
    _step(repo, "paths", report="sarif")
    done, outputs = _step(repo, "check", "--python", python, report="sarif")
    document = json.loads(open(outputs["report-file"], encoding="utf-8").read())
    jsonschema.validate(document, json.loads((DATA / "sarif-schema-2.1.0.json").read_text()))
    (run,) = document["runs"]
    assert run["automationDetails"] == {"id": "preclint/source/"} and outputs["exit-code"] == "1"
    uris = sorted(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"])
    assert uris == ["-%20dash%20me.py", "new.py", "old.py"]

    done, outputs = _step(repo, "install", models="net.py")  # the graph check needs the whole tool
    assert done.returncode == 2 and done.stdout.startswith("::error title=preclint action::models are checked")
    _full_install_runs_the_graph_check_of_the_named_models(repo)


def _full_install_runs_the_graph_check_of_the_named_models(repo):
    """install full into the job's Python: here a virtual environment that sees this machine's torch
    (a fresh one would download it), as a job's Python after it installed its project: the models
    import that project (an editable install: a .pth file in the job's site-packages), never the
    checkout's preclint/ on the job's PYTHONPATH."""
    job = repo.parent / "job-python"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(job)], check=True)
    job_python = str(job / "bin" / "python")
    project = repo.parent / "project" / "mylayers"
    project.mkdir(parents=True)
    (project / "__init__.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(4, 4)\n")
    site_packages = subprocess.run([job_python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site_packages, "mylayers.pth"), "w") as pth:
        pth.write(str(project.parent) + "\n")
    (repo / "uses_project.py").write_text("import torch\nfrom mylayers import make\n\n"
                                          "model = make()\nexample_inputs = (torch.ones(2, 4),)\n")
    job_env = _plant(repo)
    done, outputs = _step(repo, "install", install="full", models="net.py", runner_python=job_python, job=job_env)
    assert done.returncode == 0 and outputs["python"] == job_python, done.stderr
    _step(repo, "paths", paths="clean.py")
    done, outputs = _step(repo, "check", "--python", job_python, models="net.py --precision fp16\nuses_project.py",
                          report="rdjson", runner_python=job_python, job=job_env)
    assert _ran(repo) == [], done.stdout + done.stderr
    document = json.loads(open(outputs["report-file"], encoding="utf-8").read())
    assert document["source"] == {"name": "preclint"} and isinstance(document["diagnostics"], list)
    assert outputs["exit-code"] in ("0", "1"), done.stdout + done.stderr  # both checked: no error


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_pull_requests_files_never_run_in_the_action_and_cannot_forge_its_verdict(tmp_path, installed):
    """The source check of a pull request that adds HOSTILE files, with the job's PYTHONPATH on the
    checkout: none of them runs (a checkout's argparse.py ran in `python -m preclint`; its preclint/
    package made the action report exit-code 0 with no annotations), and the verdict is the findings'."""
    repo, job = _pull_request(tmp_path, hostile=True)
    _step(repo, "paths", job=job)
    done, outputs = _step(repo, "check", "--python", installed, job=job)
    assert _ran(repo) == [], done.stdout + done.stderr
    annotations = [line.split(",")[0] for line in done.stdout.splitlines() if line.startswith("::warning ")]
    assert annotations == ["::warning file=- dash me.py", "::warning file=new.py"] and outputs["exit-code"] == "1"
    _step(repo, "paths", job=job, report="sarif")
    done, outputs = _step(repo, "check", "--python", installed, job=job, report="sarif")
    assert _ran(repo) == [] and outputs["exit-code"] == "1", done.stdout + done.stderr
    (run,) = json.loads(open(outputs["report-file"], encoding="utf-8").read())["runs"]
    uris = sorted(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"])
    assert uris == ["-%20dash%20me.py", "new.py", "old.py"]


def test_a_report_that_is_not_preclints_is_one_error_line_and_exit_2(monkeypatch, tmp_path, capsys):
    """A model's code can write over its run's report: the step says so and ends with 2, no traceback."""
    action = _script()

    def run(command, **kw):
        target = command[command.index("--output") + 1]
        with open(target, "w", encoding="utf-8") as handle:
            handle.write("{not json" if "model-1" in target else '{"runs": 3}')
        return subprocess.CompletedProcess(command, 1)

    monkeypatch.setattr(action.subprocess, "run", run)
    monkeypatch.setenv("RUNNER_TEMP", str(tmp_path))
    monkeypatch.setenv("GITHUB_OUTPUT", str(tmp_path / "output"))
    monkeypatch.delenv("GITHUB_EVENT_NAME", raising=False)
    assert action.check(sys.executable, ["."], args="", fail_on="", models="net.py", report="sarif") == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("::error title=preclint action::the ") for line in lines), lines
    assert "exit-code=2" in (tmp_path / "output").read_text()
