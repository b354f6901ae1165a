#!/usr/bin/env python3
"""The floors of the source tree, checked by reading every #include (docs/architecture.md, Layout).

    check_layout.py ROOT          checks the tree at ROOT; prints each violation, exit 1 if any
    check_layout.py --planted     builds small trees with one planted violation per rule and
                                  checks that each is reported (and that a clean tree passes)

A rule names the folders it applies to and what their files may not include: a folder of the
project ("actors/") or a system header prefix ("<caf/"). Only the standard library is needed.
"""
import os
import re
import sys
import tempfile

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCES = ('.hpp', '.cpp', '.h', '.cu', '.cuh')

# Header prefixes of the packages that stay above the floor.
CAF = '<caf/'
ZMQ = ('<zmq.h', '<zmq.hpp', '<zmq_addon.hpp', '"zmq.h', '"zmq.hpp', '"zmq_addon.hpp')
MSGPACK = ('<msgpack', '"msgpack')
CUDA = ('<cuda', '<cublas', '<curand', '<nccl', '"cuda_runtime')

PROJECT = ('core', 'model', 'kernels', 'gpu', 'policies', 'storage', 'actors', 'ingress',
           'server', 'clients', 'cli', 'bench', 'tests', 'examples', 'constraints', 'programs')

# (name, folders it applies to, forbidden project folders, forbidden header prefixes)
RULES = [
    ('core is the floor: the job types include only core/ and the standard library',
     ('core',), tuple(p for p in PROJECT if p != 'core'), (CAF,) + ZMQ + MSGPACK + CUDA),
    ('storage/ stands on core/, not on actors/',
     ('storage',), ('actors',), (CAF,)),
    ('the doors (ingress/) and the server wiring (server/) sit above the layers they feed',
     ('core', 'actors', 'policies', 'storage', 'model', 'gpu', 'kernels'), ('ingress', 'server'),
     ()),
    ('policies/ are plain value types: no CAF, ZeroMQ or CUDA',
     ('policies',), ('actors', 'ingress', 'server', 'storage', 'gpu'), (CAF,) + ZMQ + CUDA),
    ('nothing outside gpu/ and kernels/ sees CUDA',
     ('core', 'model', 'policies', 'storage', 'actors', 'ingress', 'server', 'clients', 'cli',
      'constraints', 'programs'),
     (), CUDA + ('"kernels/cuda/', '"gpu/cuda_')),
    ('constraints/ are plain code: no actors, engines, doors, CAF, ZeroMQ, msgpack or CUDA',
     ('constraints',), ('actors', 'gpu', 'ingress', 'server', 'storage', 'policies', 'kernels'),
     (CAF,) + ZMQ + MSGPACK + CUDA),
    ('programs/ are plain code: no actors, model, engines, doors, CAF, ZeroMQ, msgpack or CUDA',
     ('programs',), ('actors', 'model', 'gpu', 'ingress', 'server', 'storage', 'kernels'),
     (CAF,) + ZMQ + MSGPACK + CUDA),
    ('kernels/ have no model, engine or actor knowledge',
     ('kernels',), ('model', 'gpu', 'actors', 'ingress', 'server', 'storage', 'policies'),
     (CAF,) + ZMQ + MSGPACK),
]


def includes(path):
    """(line number, quote char, included path) of every #include in a file."""
    out = []
    with open(path, encoding='utf-8', errors='replace') as f:
        for n, line in enumerate(f, 1):
            m = INCLUDE.match(line)
            if m:
                out.append((n, m.group(1), m.group(2)))
    return out


def check(root):
    """Every violation under root, as 'file:line: includes X (rule)' strings."""
    found = []
    for name, folders, bad_dirs, bad_headers in RULES:
        for folder in folders:
            top = os.path.join(root, folder)
            for dirpath, _, files in os.walk(top):
                for fn in sorted(files):
                    if not fn.endswith(SOURCES):
                        continue
                    path = os.path.join(dirpath, fn)
                    rel = os.path.relpath(path, root)
                    for n, quote, inc in includes(path):
                        spelled = quote + inc
                        head = inc.split('/', 1)[0]
                        bad = (quote == '"' and '/' in inc and head in bad_dirs) or \
                            any(spelled.startswith(h) for h in bad_headers)
                        if bad:
                            found.append('%s:%d: includes %s%s%s (%s)' %
                                         (rel, n, quote, inc, '>' if quote == '<' else '"', name))
    return found


def planted():
    """Each rule catches a planted violation of it; a tree without one passes."""
    cases = [
        ('core/job.hpp', '#include <caf/all.hpp>'),
        ('core/wire.hpp', '#include <msgpack.hpp>'),
        ('core/wire.hpp', '#include <zmq.hpp>'),
        ('core/job.hpp', '#include "actors/messages.hpp"'),
        ('storage/journal_codec.hpp', '#include "actors/messages.hpp"'),
        ('actors/admission.cpp', '#include "ingress/codec.hpp"'),
        ('model/gguf.cpp', '#include "server/config.hpp"'),
        ('gpu/engine.hpp', '#include "ingress/gateway.hpp"'),
        ('policies/qos.hpp', '#include <caf/all.hpp>'),
        ('kernels/cpu/fast.cpp', '#include "model/model.hpp"'),
        ('actors/executor.cpp', '#include <cuda_runtime.h>'),
        ('server/server.cpp', '#include "gpu/cuda_engine.hpp"'),
        ('constraints/matcher.cpp', '#include "actors/executor.hpp"'),
        ('constraints/gbnf.cpp', '#include <msgpack.hpp>'),
        ('programs/program.cpp', '#include "actors/admission.hpp"'),
        ('programs/program.cpp', '#include "model/tokenizer.hpp"'),
        ('programs/run.cpp', '#include "storage/journal_file.hpp"'),
        ('programs/program.hpp', '#include <caf/all.hpp>'),
        ('programs/run.cpp', '#include <zmq.hpp>'),
        ('programs/program.cpp', '#include <msgpack.hpp>'),
        ('programs/run.cpp', '#include <cuda_runtime.h>'),
    ]
    clean = {
        'core/job.hpp': '#include <string>\n#include "core/wire.hpp"\n',
        'storage/journal_codec.hpp': '#include "core/job.hpp"\n',
        'actors/admission.cpp': '#include <caf/all.hpp>\n#include "storage/journal_file.hpp"\n',
        'ingress/gateway.cpp': '#include <zmq.hpp>\n#include "actors/messages.hpp"\n',
        'kernels/cpu/fast.cpp': '#include "kernels/cpu/kernels.hpp"\n',
        'constraints/filter.cpp': '#include "model/sampler.hpp"\n#include "core/generation.hpp"\n',
        'programs/program.cpp': ('#include <nlohmann/json.hpp>\n#include "core/generation.hpp"\n'
                                 '#include "programs/template.hpp"\n'),
    }
    failures = 0
    with tempfile.TemporaryDirectory(prefix='sy_layout_') as tmp:
        def write_tree(root, extra):
            for rel, text in list(clean.items()) + extra:
                path = os.path.join(root, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, 'a', encoding='utf-8') as f:
                    f.write(text + '\n')

        base = os.path.join(tmp, 'clean')
        write_tree(base, [])
        if check(base):
            print('FAIL: a clean tree was reported:', check(base))
            failures += 1
        for i, (rel, line) in enumerate(cases):
            root = os.path.join(tmp, 'case%d' % i)
            write_tree(root, [(rel, line)])
            got = check(root)
            hit = [g for g in got if g.startswith(rel + ':') and line.split()[-1].strip('"<>') in g]
            if not hit:
                print('FAIL: planted %r in %s was not reported (got %s)' % (line, rel, got))
                failures += 1
            else:
                print('caught: %s' % hit[0])
    return failures


def main(argv):
    if argv[1:] == ['--planted']:
        failures = planted()
        print('%d planted violations missed' % failures)
        return 1 if failures else 0
    if len(argv) != 2:
        print(__doc__)
        return 2
    found = check(argv[1])
    for v in found:
        print(v)
    print('%d layout violations' % len(found))
    return 1 if found else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
