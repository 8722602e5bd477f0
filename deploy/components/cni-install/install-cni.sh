#!/bin/sh
# Installs tidepool's CNI plugin and network config on this node (the init container of
# components/cni-install; POSIX sh, busybox in the image).
#
# - copies the plugin binary into the CNI bin directory (temp name, then rename: a runtime
#   never executes a half-written file);
# - writes the conflist (ptp as the main plugin, tidepool-cni as its IPAM) into the CNI config
#   directory, the same way;
# - refuses, with a message and exit status 1, when another network config sorts before
#   ours: the runtime uses only the first one, so ours would be ignored and pods would get
#   their addresses elsewhere (or two agents would hand out addresses on one node);
# - refuses when the main plugin (ptp) or portmap (hostPort) is missing from the bin
#   directory.
#
# Every path comes from the environment so that tests can run it against temporary
# directories:
#   CNI_BIN_DIR      where the runtime looks for plugins       [/host/opt/cni/bin]
#   CNI_CONF_DIR     where the runtime looks for network configs [/host/etc/cni/net.d]
#   PLUGIN_SRC       the tidepool-cni binary to install         [/opt/tidepool/tidepool-cni]
#   CONFLIST_NAME    the config's file name                     [10-tidepool.conflist]
#   MAIN_PLUGIN      the main plugin the config names           [ptp]
set -eu

bin_dir=${CNI_BIN_DIR:-/host/opt/cni/bin}
conf_dir=${CNI_CONF_DIR:-/host/etc/cni/net.d}
plugin_src=${PLUGIN_SRC:-/opt/tidepool/tidepool-cni}
conf_name=${CONFLIST_NAME:-10-tidepool.conflist}
main_plugin=${MAIN_PLUGIN:-ptp}

say() { printf 'install-cni: %s\n' "$*" >&2; }
fail() {
	say "$*"
	exit 1
}

[ -f "$plugin_src" ] || fail "no plugin binary at $plugin_src"
[ -d "$bin_dir" ] || fail "no CNI bin directory $bin_dir (is the host path mounted?)"
[ -d "$conf_dir" ] || fail "no CNI config directory $conf_dir (is the host path mounted?)"
for plugin in "$main_plugin" portmap; do
	[ -x "$bin_dir/$plugin" ] ||
		fail "the plugin $plugin is not in $bin_dir: install the CNI reference plugins (containernetworking-plugins) on the node first"
done

# The runtime (libcni's ConfFiles) reads *.conf, *.conflist and *.json in lexical (byte)
# order and uses the first; anything else in the directory is ignored. With LC_ALL=C the
# shell's pathname expansion sorts by bytes too.
LC_ALL=C
export LC_ALL
first=
for f in "$conf_dir"/*; do
	case ${f##*/} in
	*.conf | *.conflist | *.json)
		if [ -f "$f" ]; then
			first=${f##*/}
			break
		fi
		;;
	esac
done
if [ -n "$first" ] && [ "$first" != "$conf_name" ] &&
	[ "$(printf '%s\n%s\n' "$first" "$conf_name" | sort | head -n 1)" = "$first" ]; then
	fail "refusing to install: $conf_dir/$first sorts before $conf_name, so the runtime would use it and ignore tidepool's config; remove or rename it (or set CONFLIST_NAME to sort first) if tidepool is meant to be this node's pod network"
fi

tmp_bin="$bin_dir/.tidepool-cni.tmp.$$"
cp "$plugin_src" "$tmp_bin"
chmod 0755 "$tmp_bin"
mv -f "$tmp_bin" "$bin_dir/tidepool-cni"
say "installed $bin_dir/tidepool-cni"

# The agent's defaults (socket, spool, marker) are the plugin's defaults, so the IPAM
# section names only its type. cniVersion 1.0.0: every plugin of the list must accept it,
# and the reference plugins before v1.5 (Debian bookworm's 1.1.1 among them) refuse 1.1.0
# ("incompatible CNI versions"); tidepool-cni accepts both. portmap after the main plugin serves hostPort (the runtime
# passes the pod's port mappings as the portMappings capability). ptp's own ipMasq stays
# off: it would masquerade traffic between pods of different nodes too; the agent's
# --masquerade does it for traffic leaving the pod networks only.
tmp_conf="$conf_dir/.$conf_name.tmp.$$"
cat >"$tmp_conf" <<CONF
{
  "cniVersion": "1.0.0",
  "name": "tidepool",
  "plugins": [
    {
      "type": "$main_plugin",
      "ipam": {
        "type": "tidepool-cni"
      }
    },
    {
      "type": "portmap",
      "capabilities": {
        "portMappings": true
      }
    }
  ]
}
CONF
chmod 0644 "$tmp_conf"
mv -f "$tmp_conf" "$conf_dir/$conf_name"
say "installed $conf_dir/$conf_name"
