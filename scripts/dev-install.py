"""Makes the freshly built extension and command usable from the repository's .venv.

Copies build/_zbatch*.so next to python/zbatch/__init__.py and build/zbatch to
python/zbatch/bin/zbatch (where a wheel carries the command, for `python -m zbatch`), and drops a .pth file into the
venv's site-packages pointing at python/, so `import zbatch` works from anywhere in the venv
without a pip install (pip install . builds the same through scikit-build-core).
"""
import glob
import os
import shutil
import sys
import sysconfig

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = os.path.join(root, sys.argv[1] if len(sys.argv) > 1 else "build")
pkg = os.path.join(root, "python", "zbatch")
built = glob.glob(os.path.join(build, "_zbatch*.so"))
if not built:
    sys.exit("dev-install: no _zbatch*.so in " + build)
for old in glob.glob(os.path.join(pkg, "_zbatch*.so")):
    os.remove(old)
for so in built:
    shutil.copy2(so, pkg)
cli = os.path.join(build, "zbatch")
if os.path.isfile(cli):
    os.makedirs(os.path.join(pkg, "bin"), exist_ok=True)
    shutil.copy2(cli, os.path.join(pkg, "bin", "zbatch"))
pth = os.path.join(sysconfig.get_paths()["purelib"], "zbatch-dev.pth")
want = os.path.join(root, "python") + "\n"
if not os.path.exists(pth) or open(pth).read() != want:
    with open(pth, "w") as f:
        f.write(want)
