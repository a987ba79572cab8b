"""What pyproject.toml cannot say alone: the packages, found rather than listed, so that a new subpackage of helpers/
can never be left out of the wheel, and the kit's folders mapped into the package (helpers/kit/<folder>)."""

from setuptools import find_packages, setup

KIT = {f"helpers.kit.{folder}": folder for folder in ("notebooks", "k8s", "models")}

setup(packages=[*find_packages(include=["helpers", "helpers.*"]), *KIT], package_dir=KIT)
