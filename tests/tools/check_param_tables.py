#!/usr/bin/env python3
"""Every settings table of the sources (each `struct weft_param NAME[] = {` in
collectives/, transport/ and zero/) is named in the library's one list,
weft_param_tables in collectives/api/config.c, and the list names no table
that the sources do not define. Fails naming what is missing.

usage: check_param_tables.py SOURCE_ROOT
"""
import os
import re
import sys

DEF_RE = re.compile(r'^\s*struct\s+weft_param\s+([A-Za-z_]\w*)\s*\[\s*\]\s*=\s*\{', re.M)
LIST_RE = re.compile(r'weft_param_tables\s*\[\s*\]\s*=\s*\{(.*?)\};', re.S)


def strip_comments(text):
    text = re.sub(r'/\*.*?\*/', ' ', text, flags=re.S)
    return re.sub(r'//[^\n]*', ' ', text)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else '.'
    defined = {}
    for layer in ('collectives', 'transport', 'zero'):
        for d, _, names in os.walk(os.path.join(root, layer)):
            for name in names:
                if name.endswith(('.c', '.cu')):
                    path = os.path.join(d, name)
                    with open(path, encoding='utf-8', errors='replace') as f:
                        for table in DEF_RE.findall(strip_comments(f.read())):
                            defined[table] = os.path.relpath(path, root)
    config = os.path.join(root, 'collectives', 'api', 'config.c')
    with open(config, encoding='utf-8') as f:
        m = LIST_RE.search(strip_comments(f.read()))
    if m is None:
        print('FAIL: no weft_param_tables[] list in collectives/api/config.c')
        return 1
    listed = [n for n in re.findall(r'[A-Za-z_]\w*', m.group(1)) if n != 'NULL']
    fail = 0
    if len(defined) < 10:
        print('FAIL: only %d tables found in the sources' % len(defined))
        fail = 1
    for table, path in sorted(defined.items()):
        if table not in listed:
            print('FAIL: %s (%s) is missing from weft_param_tables' % (table, path))
            fail = 1
    for table in listed:
        if table not in defined:
            print('FAIL: weft_param_tables names %s, which no source defines' % table)
            fail = 1
    if len(set(listed)) != len(listed):
        print('FAIL: weft_param_tables names a table twice')
        fail = 1
    if not fail:
        print('ok: the %d settings tables of the sources are all in weft_param_tables' % len(defined))
    return fail


if __name__ == '__main__':
    sys.exit(main())
