/**
 * The netns helper runs as root on every node: its binary must stay hardened. A tiny ELF64 reader
 * (no binutils) checks the built file: position independent and static (ET_DYN, no interpreter),
 * full RELRO (GNU_RELRO plus BIND_NOW), the fortified libc calls, the stack protector, and the
 * compile flags GCC records (-frecord-gcc-switches), so that none of netns-helper/Makefile's
 * hardening goes away unnoticed.
 */
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { resolveHelperPath } from '../../agent/netns/helper-protocol.ts';

const ET_DYN = 3;
const PT_DYNAMIC = 2;
const PT_INTERP = 3;
const PT_GNU_RELRO = 0x6474e552;
const DT_FLAGS = 30;
const DT_FLAGS_1 = 0x6ffffffb;
const DF_BIND_NOW = 0x8;
const DF_1_NOW = 0x1;
const DF_1_PIE = 0x08000000;
const SHT_SYMTAB = 2;

interface Elf {
  type: number;
  segments: { type: number; offset: number; size: number }[];
  dynamic: Map<number, bigint>;
  sections: Map<string, Buffer>;
  symbols: Set<string>;
}

function cString(buf: Buffer, at: number): string {
  const end = buf.indexOf(0, at);
  return buf.toString('latin1', at, end < 0 ? buf.length : end);
}

/** Reads what the checks need from a little-endian ELF64 file. */
function readElf(file: Buffer): Elf {
  expect(file.subarray(0, 4).toString('latin1')).toBe('\x7fELF');
  expect(file[4], 'ELFCLASS64').toBe(2);
  expect(file[5], 'little-endian').toBe(1);
  const u16 = (o: number): number => file.readUInt16LE(o);
  const u32 = (o: number): number => file.readUInt32LE(o);
  const u64 = (o: number): number => Number(file.readBigUInt64LE(o));
  const [phoff, phentsize, phnum] = [u64(32), u16(54), u16(56)];
  const [shoff, shentsize, shnum, shstrndx] = [u64(40), u16(58), u16(60), u16(62)];
  const segments = Array.from({ length: phnum }, (_, i) => {
    const o = phoff + i * phentsize;
    return { type: u32(o), offset: u64(o + 8), size: u64(o + 32) };
  });
  const dynamic = new Map<number, bigint>();
  for (const seg of segments.filter((s) => s.type === PT_DYNAMIC)) {
    for (let o = seg.offset; o + 16 <= seg.offset + seg.size; o += 16) {
      const tag = Number(file.readBigInt64LE(o));
      if (tag === 0) break;
      dynamic.set(tag, file.readBigUInt64LE(o + 8));
    }
  }
  const headers = Array.from({ length: shnum }, (_, i) => {
    const o = shoff + i * shentsize;
    return { name: u32(o), type: u32(o + 4), offset: u64(o + 24), size: u64(o + 32), link: u32(o + 40) };
  });
  const body = (h: { offset: number; size: number }): Buffer => file.subarray(h.offset, h.offset + h.size);
  const names = body(headers[shstrndx] as { offset: number; size: number });
  const sections = new Map(headers.map((h) => [cString(names, h.name), body(h)] as const));
  const symbols = new Set<string>();
  for (const h of headers.filter((x) => x.type === SHT_SYMTAB)) {
    const strtab = body(headers[h.link] as { offset: number; size: number });
    for (let o = h.offset; o + 24 <= h.offset + h.size; o += 24) symbols.add(cString(strtab, u32(o)));
  }
  return { type: u16(16), segments, dynamic, sections, symbols };
}

describe('the built netns helper is a hardened ELF', () => {
  const elf = readElf(readFileSync(resolveHelperPath()));

  it('is a static PIE: ET_DYN, no interpreter, DF_1_PIE', () => {
    expect(elf.type).toBe(ET_DYN);
    expect(elf.segments.some((s) => s.type === PT_INTERP)).toBe(false);
    expect((elf.dynamic.get(DT_FLAGS_1) ?? 0n) & BigInt(DF_1_PIE)).not.toBe(0n);
  });

  it('has full RELRO: a GNU_RELRO segment and BIND_NOW', () => {
    expect(elf.segments.some((s) => s.type === PT_GNU_RELRO)).toBe(true);
    const bindNow = ((elf.dynamic.get(DT_FLAGS) ?? 0n) & BigInt(DF_BIND_NOW)) !== 0n
      || ((elf.dynamic.get(DT_FLAGS_1) ?? 0n) & BigInt(DF_1_NOW)) !== 0n;
    expect(bindNow).toBe(true);
  });

  it('calls the fortified libc functions at level 3, with the stack protector', () => {
    const chk = [...elf.symbols].filter((s) => /^__[a-z]+_chk$/.test(s) && s !== '__stack_chk_fail');
    // Our own calls (vsnprintf into a message, fprintf, memcpy into a sized buffer) became checked ones.
    expect(chk).toEqual(expect.arrayContaining(['__vsnprintf_chk', '__fprintf_chk', '__memcpy_chk']));
    expect(elf.symbols.has('__stack_chk_fail')).toBe(true);
    // The level glibc really applied (main.c keeps it in the binary; a lowered level shows here).
    const rodata = elf.sections.get('.rodata')?.toString('latin1') ?? '';
    expect(rodata).toContain('probe-agent-netns-helper fortify level 3');
  });

  it('was compiled with stack-clash probing, the strong stack protector and -fPIE (every object)', () => {
    const recorded = (elf.sections.get('.GCC.command.line')?.toString('latin1') ?? '').split('\0').filter((l) => l.startsWith('GNU C'));
    expect(recorded.length).toBeGreaterThan(0);
    for (const line of recorded) {
      expect(line).toContain('-fstack-clash-protection');
      expect(line).toContain('-fstack-protector-strong');
      expect(line).toContain('-fPIE');
    }
  });
});
