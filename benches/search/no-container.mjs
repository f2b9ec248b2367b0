// Preloaded (node --import) into desktop-commander during capture only.
//
// desktop-commander appends host-specific text to several tool descriptions
// when it detects a container (/.dockerenv, /proc/1/cgroup, /proc/1/environ,
// /proc/mounts, /mnt/*): container name, mount points, host folders. That would
// make the captured descriptions depend on the capturing machine and leak its
// layout. This shim hides those indicators so that every machine captures the
// same "plain Linux host" descriptions the server shows outside containers.
import fs from "node:fs";

const HIDDEN = new Set(["/.dockerenv", "/proc/1/cgroup", "/proc/1/environ", "/proc/mounts", "/var/run/secrets/kubernetes.io"]);
const enoent = (p) => Object.assign(new Error(`ENOENT: no such file or directory, open '${p}'`), { code: "ENOENT", errno: -2, path: p });

const { existsSync, readFileSync } = fs;
fs.existsSync = function (p, ...rest) {
  return HIDDEN.has(String(p)) ? false : existsSync.call(this, p, ...rest);
};
fs.readFileSync = function (p, ...rest) {
  if (HIDDEN.has(String(p))) throw enoent(String(p));
  return readFileSync.call(this, p, ...rest);
};
