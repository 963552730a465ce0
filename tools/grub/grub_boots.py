"""Which menu entry GRUB itself boots with a grub.cfg and a grubenv: GRUB's own code decides, run
as grub-emu (Debian's grub-emu package). Every menu entry of the grub.cfg gets a first line
that prints a mark and halts, so nothing is booted; the console is made plain text, and the
menu's timeout 0. Nothing else of the file changes. GRUB prints "Booting `<title>'" for the
submenus it enters and the entry it boots: those titles, joined by '>', are the answer.

    python3 tools/grub/grub_boots.py GRUB_CFG [GRUBENV]   # prints the booted entry's titles, such as
                                                 # Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.1.0-18-amd64
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile

MENUENTRY = re.compile(r"^\s*menuentry\s.*\{\s*$")


def boots(cfg, grubenv=None):
    with tempfile.TemporaryDirectory() as prefix:
        lines = []
        with open(cfg, encoding="utf-8") as handle:
            for line in handle.read().splitlines():
                lines.append(line)
                if MENUENTRY.match(line):
                    lines.append('echo "SCV-BOOTED"; halt')
        lines += ["terminal_output console", "set timeout=0", "set timeout_style=menu"]
        with open(os.path.join(prefix, "grub.cfg"), "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines) + "\n")
        if grubenv:
            shutil.copy(grubenv, os.path.join(prefix, "grubenv"))
        typescript = os.path.join(prefix, "typescript")
        subprocess.run(["timeout", "30", "script", "-qec", "grub-emu -d %s" % prefix, typescript],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        with open(typescript, "rb") as handle:
            output = handle.read()
        if b"SCV-BOOTED" not in output:
            return None
        titles = re.findall(rb"Booting `(.*?)'\r?\n", output[:output.index(b"SCV-BOOTED")])
        return ">".join(title.decode("utf-8") for title in titles)


if __name__ == "__main__":
    chosen = boots(*sys.argv[1:3])
    if chosen is None:
        sys.exit("grub-emu booted no menu entry")
    print(chosen)
