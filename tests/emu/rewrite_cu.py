#!/usr/bin/env python3
"""CUDA emulator: turns a .cu file into C++ for the host compiler.

Two rewrites, nothing else changes (line numbers kept, #line names the original file):
  name<<<grid, block[, smem[, stream]]>>>(args)  ->  ::sy_emu::launch("name", ::sy_emu::LaunchCfg(grid, block, ...), name)(args)
  extern __shared__ [__align__(N)] T name[];     ->  T* name = ::sy_emu::dynamic_smem<T>();
Usage: rewrite_cu.py IN.cu OUT.cpp
"""
import os
import re
import sys

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:\s*<[^<>;{}()]*>)?)(\s*)<<<(.*?)>>>", re.S)
SMEM = re.compile(r"extern\s+__shared__\s+(?:__align__\(\s*\d+\s*\)\s+)?([\w\s]+?)\s+(\w+)\s*\[\s*\]\s*;")


def launch(m):
    name, space, cfg = m.group(1), m.group(2), m.group(3)
    label = re.sub(r"\s+", "", name)
    newlines = "\n" * (space.count("\n") + cfg.count("\n"))
    cfg = " ".join(cfg.split())
    return f'::sy_emu::launch("{label}", ::sy_emu::LaunchCfg({cfg}), {name}){newlines}'


def main():
    src, dst = sys.argv[1], sys.argv[2]
    with open(src, encoding="utf-8") as f:
        text = f.read()
    text = SMEM.sub(lambda m: f"{m.group(1)}* {m.group(2)} = ::sy_emu::dynamic_smem<{m.group(1)}>();", text)
    text = LAUNCH.sub(launch, text)
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    with open(dst, "w", encoding="utf-8") as f:
        f.write(f'#line 1 "{src}"\n')
        f.write(text)


if __name__ == "__main__":
    main()
