"""Records the checkout the package was installed from (kvq/_checkout.py in the built
package), so that an installed kvq finds that checkout's build/libkvq.so from any folder.
Everything else is in pyproject.toml."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):
    def run(self):
        super().run()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if os.path.isfile(os.path.join(root, "include", "kvq", "common.h")):
            target = os.path.join(self.build_lib, "kvq", "_checkout.py")
            with open(target, "w") as f:
                f.write('"""Written by setup.py: the checkout this package was built from."""\n')
                f.write(f"ROOT = {root!r}\n")


setup(cmdclass={"build_py": BuildPy})
