#!/usr/bin/env python3
"""Writes a program's manual page (section 1, roff) from its --help.

    help2roff.py PROGRAM NAME VERSION SUMMARY OUT [SEE_ALSO...]

Runs PROGRAM --help (its usage, on stdout or stderr, whatever its status),
names it NAME where the usage printed its path, and writes OUT: NAME and its
one-line SUMMARY, the usage lines as the synopsis, the rest as the
description, kept as printed (the help is laid out for a terminal already),
then the environment and files every weft program shares and SEE ALSO."""
import subprocess
import sys


def escape(line):
    line = line.replace("\\", "\\e")
    # a line that starts with a control character would be read as a request
    if line.startswith((".", "'")):
        line = "\\&" + line
    return line


def main():
    program, name, version, summary, out = sys.argv[1:6]
    see_also = [s for s in sys.argv[6:] if s != name]
    try:
        run = subprocess.run([program, "--help"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"help2roff: {program} --help: {e}")
    text = run.stdout.decode("utf-8", errors="replace").replace(program, name)
    lines = [l.rstrip() for l in text.splitlines()]
    # a program without --help says so before its usage
    if lines and ("invalid option" in lines[0] or "unrecognized option" in lines[0]):
        lines.pop(0)
    while lines and not lines[0]:
        lines.pop(0)
    if not lines or not lines[0].startswith("usage:"):
        sys.exit(f"help2roff: {program} --help printed no usage line")
    usage = [lines.pop(0)[len("usage:"):].strip()]
    while lines and lines[0].startswith(" ") and lines[0].strip().startswith("["):
        usage.append(lines.pop(0).strip())  # the usage's continuation lines
    while lines and not lines[0]:
        lines.pop(0)
    roff = [f'.TH {name.upper()} 1 "" "weft {version}" "weft manual"',
            ".SH NAME", f"{escape(name)} \\- {escape(summary)}",
            ".SH SYNOPSIS", ".nf"] + [escape(u) for u in usage] + [".fi"]
    if lines:
        roff += [".SH DESCRIPTION", ".nf"] + [escape(l) for l in lines] + [".fi"]
    roff += [".SH ENVIRONMENT",
             ".B weft-info --config",
             "prints every WEFT_* variable the library reads, with its value;",
             "weft's docs/environment.md says what each does."]
    if see_also:
        roff += [".SH SEE ALSO", ", ".join(f"\\fB{s}\\fR(1)" for s in see_also)]
    with open(out, "w") as f:
        f.write("\n".join(roff) + "\n")


if __name__ == "__main__":
    main()
