#!/usr/bin/env python3
"""Checks that a README command installs what it runs (issue 59).

Reads the programs a command executed (strace's execve trace, successful calls only),
finds the Debian package of each, and fails for every program whose package is neither
in the set the command installs (`scripts/setup.sh --list MODE`), nor a dependency of one
in that set, nor on every Debian machine (Essential or Priority required). A program no
package owns (the build's own, a temporary file) is the command's own making and passes.

  command_needs.py SETUP_SH MODE TRACE_FILE      (MODE: "" for the demo, --package, ...)
"""
import os
import re
import subprocess
import sys


def installed_packages():
    """name -> (depends text, provides text, essential, priority), for installed ones."""
    out = subprocess.run(
        ["dpkg-query", "-W", "-f",
         "${Package}\t${Status}\t${Depends}, ${Pre-Depends}\t${Provides}\t${Essential}\t${Priority}\n"],
        check=True, capture_output=True, text=True).stdout
    pkgs = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) != 6 or not parts[1].endswith("installed") or "not-installed" in parts[1]:
            continue
        pkgs[parts[0]] = (parts[2], parts[3], parts[4] == "yes", parts[5])
    return pkgs


def names(field):
    """Every package named in a Depends or Provides field, alternatives included."""
    result = []
    for clause in field.split(","):
        for alt in clause.split("|"):
            name = re.sub(r"\(.*?\)|\[.*?\]|<.*?>", "", alt).strip()
            name = name.split(":")[0]
            if name:
                result.append(name)
    return result


def closure(roots, pkgs):
    providers = {}
    for name, (_, provides, _, _) in pkgs.items():
        for p in names(provides):
            providers.setdefault(p, []).append(name)
    seen, todo = set(), list(roots)
    while todo:
        n = todo.pop()
        for real in ([n] if n in pkgs else []) + providers.get(n, []):
            if real in seen:
                continue
            seen.add(real)
            todo.extend(names(pkgs[real][0]))
    return seen


def executed(trace):
    paths = set()
    with open(trace, errors="replace") as f:
        for line in f:
            m = re.search(r'execve\("([^"]+)".*\) = 0$', line.rstrip())
            if m:
                paths.add(m.group(1))
    return paths


def owners(paths):
    """path -> package, for the paths a package owns (usr-merge spellings tried too)."""
    spellings = {}
    for p in paths:
        candidates = {p, os.path.realpath(p)}
        for c in list(candidates):
            if c.startswith("/usr/"):
                candidates.add(c[4:])
            else:
                candidates.add("/usr" + c)
        for c in candidates:
            spellings.setdefault(c, set()).add(p)
    out = subprocess.run(["dpkg-query", "-S"] + sorted(spellings), capture_output=True,
                         text=True).stdout
    found = {}
    for line in out.splitlines():
        if ": " not in line:
            continue
        pkg_list, path = line.split(": ", 1)
        if path not in spellings or pkg_list.startswith("diversion by"):
            continue
        for original in spellings[path]:
            found.setdefault(original, pkg_list.split(",")[0].strip().split(":")[0])
    return found


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    setup, mode, trace = sys.argv[1:]
    args = [setup, "--list"] + ([mode] if mode else [])
    wanted = subprocess.run(args, check=True, capture_output=True, text=True).stdout.split()
    pkgs = installed_packages()
    base = [n for n, (_, _, essential, prio) in pkgs.items() if essential or prio == "required"]
    allowed = closure(wanted + base, pkgs)
    paths = executed(trace)
    if not paths:
        print(f"FAIL no program found in {trace}: was the command traced?")
        return 1
    named = "setup.sh" + (" " + mode if mode else "")
    missing = {}
    for path, pkg in owners(paths).items():
        if pkg not in allowed:
            missing.setdefault(pkg, []).append(path)
    for pkg, progs in sorted(missing.items()):
        print(f"FAIL the command ran {', '.join(sorted(progs))} from package {pkg}, "
              f"which `{named}` does not install")
    print(f"{len(paths)} programs run, {len(wanted)} packages named by {named}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
