#!/usr/bin/env python3
"""Checks the layering inside each layer: no loop of files in collectives/,
transport/, zero/ or tools/ (each program's files, tools/bench's programs
aside), and no transport name compared in collectives/. Inside transport/,
base/ uses nothing else, bootstrap/ and topology/ use base/ only; outside
transport/, the bootstrap and the topology are reached through their interface
headers only (SUBLAYER_INTERFACES).

A module is a source file and its header (collectives/algo/cma.c and .h are one
module, "algo/cma"). Module A depends on module B when a file of A includes a
header of B, or calls (or takes the address of) a function that a file of B
defines. The check fails when this graph has a cycle (it prints every strongly
connected set of modules and one loop through it), and when a file of
collectives/ compares a string against a transport's name (transports describe
their capabilities in their descriptor instead).

usage: check_layers.py [SOURCE_ROOT] [--graph]

Before it checks SOURCE_ROOT it checks itself on a made-up tree with a loop
and a name comparison, so that a checker that finds nothing fails.
"""
import os
import re
import sys

C_EXTS = ('.c', '.h', '.cuh', '.cu')
TRANSPORT_NAMES = ('shm', 'socket', 'ucx', 'cuda_ipc', 'p2p')
KEYWORDS = {'if', 'for', 'while', 'switch', 'return', 'sizeof', 'alignof', 'defined',
            'static_assert', '_Static_assert', '__attribute__', 'offsetof', 'alignas',
            'typeof', '__typeof__', 'va_arg'}


def strip_code(text):
    """The text without comments, string and character literals (same line count)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith('/*', i):
            j = text.find('*/', i + 2)
            j = n if j < 0 else j + 2
            out.append('\n' * text.count('\n', i, j))
            i = j
        elif text.startswith('//', i):
            j = text.find('\n', i)
            i = n if j < 0 else j
        elif c in '"\'':
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == '\\' else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return ''.join(out)


def module_of(rel):
    return os.path.splitext(rel)[0]


LAYERS = ('collectives', 'transport', 'zero', 'tools')
SKIP_DIRS = ('bench', 'torch_weft', 'sanitize')  # separate programs, or not C


def scan(root, layer='collectives'):
    coll = os.path.join(root, layer)
    files = {}
    for d, dirs, names in os.walk(coll):
        dirs[:] = [x for x in dirs if x not in SKIP_DIRS]
        for name in names:
            if name.endswith(C_EXTS):
                path = os.path.join(d, name)
                with open(path, encoding='utf-8', errors='replace') as f:
                    files[os.path.relpath(path, coll)] = f.read()
    return coll, files


DEF_RE = re.compile(r'^(?!static\b)(?:[A-Za-z_][\w\s\*]*?[\s\*])?([A-Za-z_]\w*)\s*\(([^;{]*)\)\s*\{',
                    re.M)
INC_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
IDENT_RE = re.compile(r'\b([A-Za-z_]\w*)\b')


def definitions(code):
    """Functions with external linkage defined at file scope in code."""
    names = set()
    for m in DEF_RE.finditer(code):
        if m.group(1) not in KEYWORDS:
            names.add(m.group(1))
    # static inline functions in headers are visible to every includer
    for m in re.finditer(r'^static\s+inline\s+[\w\s\*]*?\b([A-Za-z_]\w*)\s*\([^;{]*\)\s*\{',
                         code, re.M):
        names.add(m.group(1))
    return names


TABLE_RE = re.compile(r'^(?!static\b)(?:const\s+)?struct\s+\w+\s+(?:\*\s*const\s+)?'
                      r'([A-Za-z_]\w*)\s*\[[^\]]*\]\s*=', re.M)


def tables(code):
    """Tables (arrays) with external linkage defined at file scope in code."""
    return {m.group(1) for m in TABLE_RE.finditer(code)}


PROTO_RE = re.compile(r'^[A-Za-z_][\w\s\*]*?\b([A-Za-z_]\w*)\s*\([^;{]*\)[^;{]*;', re.M)
# an extern declaration of a table is not a use either
EXTERN_RE = re.compile(r'^\s*extern\s+[\w\s\*]*?\b([A-Za-z_]\w*)\s*\[[^\]]*\]\s*;', re.M)


def build_graph(coll, files, with_tables=False):
    """Module -> {module it depends on: why}. A use of another module's table
    (a settings table, say) counts only with_tables: such data does not make
    a loop of calls, but it does tie a lower layer to an upper one."""
    stripped = {rel: strip_code(text) for rel, text in files.items()}
    defined_in = {}
    for rel, code in stripped.items():
        names = definitions(code) | (tables(code) if with_tables else set())
        for name in names:
            defined_in.setdefault(name, set()).add(module_of(rel))
    edges = {module_of(rel): {} for rel in files}
    for rel, text in files.items():
        mod = module_of(rel)
        here = os.path.dirname(os.path.join(coll, rel))
        for m in INC_RE.finditer(text):
            target = os.path.normpath(os.path.join(here, m.group(1)))
            target_rel = os.path.relpath(target, coll)
            if target_rel.startswith('..') or target_rel not in files:
                continue
            dep = module_of(target_rel)
            if dep != mod:
                edges[mod].setdefault(dep, 'includes ' + m.group(1) + ' (' + rel + ')')
        # a prototype's name is not a use (a header declares what others define)
        declared_at = {m.start(1) for m in PROTO_RE.finditer(stripped[rel])}
        declared_at |= {m.start(1) for m in EXTERN_RE.finditer(stripped[rel])}
        for m in IDENT_RE.finditer(stripped[rel]):
            if m.start(1) in declared_at:
                continue
            owners = defined_in.get(m.group(1), ())
            if mod in owners:
                continue  # its own (alternative implementations define the same names)
            for dep in owners:
                if dep != mod:
                    edges[mod].setdefault(dep, 'uses ' + m.group(1) + ' (' + rel + ')')
    return edges


def sccs(edges):
    """Tarjan's strongly connected components, iterative."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in edges:
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def one_loop(edges, comp):
    """A shortest path from comp[0] back to itself inside comp."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v]):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                path.reverse()
                return path + [start]
            if w in members and w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


NAME_CMP_RE = re.compile(r'\b(?:strn?case)?(?:strn?cmp)\s*\(([^;]*)\)', re.S)


def name_compares(files):
    found = []
    for rel, text in files.items():
        for m in NAME_CMP_RE.finditer(text):
            args = m.group(1)
            if re.search(r'->\s*name\b', args) and re.search(r'transport|\bt\b|->transport', args):
                found.append((rel, m.group(0).split('\n')[0]))
                continue
            for name in TRANSPORT_NAMES:
                if re.search(r'"' + name + r'"', args):
                    found.append((rel, m.group(0).split('\n')[0]))
    return found


# transport/'s folders and what each may use besides itself (the rest of
# transport/ may use all of them).
SUBLAYERS = {'base': (), 'bootstrap': ('base',), 'topology': ('base',)}
# The headers through which the layers above reach the bootstrap and the
# topology: the bootstrap's (ring, messages, ids, launcher environments) and
# the topology's (the machine's tree, placement).
SUBLAYER_INTERFACES = ('transport/bootstrap/bootstrap.h', 'transport/topology/topo.h')


def sublayer_breaks(edges):
    """Dependencies of transport/'s base, bootstrap and topology folders that
    leave what they may use: (module, dependency, why)."""
    out = []
    for mod in sorted(edges):
        top = mod.split('/')[0]
        if top not in SUBLAYERS or '/' not in mod:
            continue
        allowed = (top,) + SUBLAYERS[top]
        for dep, why in sorted(edges[mod].items()):
            if dep.split('/')[0] not in allowed or '/' not in dep:
                out.append((mod, dep, why))
    return out


def interface_breaks(root, layer, files):
    """Files of layer/ that include a header of transport/bootstrap/ or
    transport/topology/ other than SUBLAYER_INTERFACES: (file, header)."""
    out = []
    base = os.path.join(root, layer)
    for rel, text in sorted(files.items()):
        here = os.path.dirname(os.path.join(base, rel))
        for m in INC_RE.finditer(text):
            target = os.path.relpath(os.path.normpath(os.path.join(here, m.group(1))), root)
            if (target.startswith(('transport/bootstrap/', 'transport/topology/')) and
                    target not in SUBLAYER_INTERFACES):
                out.append((rel, target))
    return out


def check(root, graph=False, quiet=False, layer='collectives'):
    """0 when layer/ under root is clean, else 1 (and what is wrong)."""
    coll, files = scan(root, layer)
    if not files:
        print('check_layers: no sources under ' + coll)
        return 1
    edges = build_graph(coll, files)
    say = (lambda *a: None) if quiet else print
    if graph:
        for mod in sorted(edges):
            say(mod + ' -> ' + ', '.join(sorted(edges[mod])))
    bad = 0
    for comp in sccs(edges):
        bad = 1
        loop = one_loop(edges, comp)
        say('loop of %d modules: %s' % (len(comp), ' '.join(comp)))
        for a, b in zip(loop, loop[1:]):
            say('  %s -> %s: %s' % (a, b, edges[a][b]))
    if layer == 'transport':
        for mod, dep, why in sublayer_breaks(build_graph(coll, files, with_tables=True)):
            bad = 1
            say('transport/%s uses transport/%s: %s' % (mod, dep, why))
    else:
        for rel, target in interface_breaks(root, layer, files):
            bad = 1
            say('%s/%s includes %s: the bootstrap and the topology are reached through %s'
                % (layer, rel, target, ' and '.join(SUBLAYER_INTERFACES)))
    names_checked = layer == 'collectives'
    for rel, what in name_compares(files) if names_checked else ():
        bad = 1
        say('transport name compared in collectives/%s: %s' % (rel, what))
    nedges = sum(len(v) for v in edges.values())
    clean = 'no loop, no transport name' if names_checked else 'no loop'
    say('check_layers: %s/: %d files, %d modules, %d dependencies: %s' %
        (layer, len(files), len(edges), nedges, 'FAILED' if bad else clean))
    return bad


SELF_TEST = {
    'core/a.h': 'int a_get(void);\n',
    'core/a.c': '#include "a.h"\nint a_get(void) { return 1; }\n',
    'algo/b.c': '#include "../core/a.h"\nint b_run(void) { return a_get(); }\n',
    'api/c.c': 'int b_run(void);\nint c_call(void) { return b_run(); }\n',
}


def self_test():
    """Whether the checker passes a clean tree and fails a loop and a name compared."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        def write(files):
            for rel, text in files.items():
                path = os.path.join(tmp, 'collectives', rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, 'w') as f:
                    f.write(text)
        write(SELF_TEST)
        if check(tmp, quiet=True) != 0:
            return 'a tree without a loop failed'
        write({'core/a.c': '#include "a.h"\nint c_call(void);\n'
                           'int a_get(void) { return c_call(); }\n'})
        if check(tmp, quiet=True) == 0:
            return 'a loop core/a -> api/c -> algo/b -> core/a passed'
        write(SELF_TEST)
        write({'algo/b.c': '#include <string.h>\nstruct t { const char *name; };\n'
                           'int b_run(const struct t *t) { return strcmp(t->name, "shm"); }\n'})
        if check(tmp, quiet=True) == 0:
            return 'a transport name compared passed'
        write(SELF_TEST)
        write({'algo/b.c': '#include "../../' + 'transport/bootstrap/ring.h"\n'
                           'int b_run(void) { return 0; }\n'})
        if check(tmp, quiet=True) == 0:
            return 'a bootstrap header outside its interface passed'
        for rel, text in {'base/s.h': 'int s_get(void);\n',
                          'base/s.c': '#include "s.h"\nint s_get(void) { return 0; }\n',
                          'topology/t.c': '#include "../base/s.h"\n'
                                          'int t_get(void) { return s_get(); }\n'}.items():
            path = os.path.join(tmp, 'transport', rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, 'w') as f:
                f.write(text)
        if check(tmp, quiet=True, layer='transport') != 0:
            return 'topology/ using base/ failed'
        with open(os.path.join(tmp, 'transport', 'topology', 't.c'), 'w') as f:
            f.write('int t_get(void) { return 1; }\n')
        with open(os.path.join(tmp, 'transport', 'base', 's.c'), 'w') as f:
            f.write('#include "s.h"\nint t_get(void);\nint s_get(void) { return t_get(); }\n')
        if check(tmp, quiet=True, layer='transport') == 0:
            return 'base/ using topology/ passed'
        with open(os.path.join(tmp, 'transport', 'topology', 't.c'), 'w') as f:
            f.write('struct weft_param t_params[] = {0};\n')
        with open(os.path.join(tmp, 'transport', 'base', 's.c'), 'w') as f:
            f.write('#include "s.h"\nextern struct weft_param t_params[];\n'
                    'int s_get(void) { return t_params[0].x; }\n')
        if check(tmp, quiet=True, layer='transport') == 0:
            return "base/ using topology/'s table passed"
    return None


def main(argv):
    root = next((a for a in argv[1:] if not a.startswith('--')),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..'))
    broken = self_test()
    if broken:
        print('check_layers: self-test: ' + broken)
        return 1
    return max(check(root, graph='--graph' in argv, layer=layer) for layer in LAYERS)


if __name__ == '__main__':
    sys.exit(main(sys.argv))
