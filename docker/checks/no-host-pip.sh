# The host's pip configuration was mounted read-only during the build, never copied: an empty
# /etc/pip.conf and empty mount points under /run/pip-host are all that may remain of it.
if [ -s /etc/pip.conf ]; then echo "/etc/pip.conf is not empty:"; cat /etc/pip.conf; exit 1; fi
if [ -d /run/pip-host ]; then
  left=$(find /run/pip-host \( -type f -size +0c \) -o -type l | head -20)
  if [ -n "$left" ]; then echo "files left under /run/pip-host:"; echo "$left"; exit 1; fi
fi
files=$(pip config list | grep -v '^:env:' || true)
if [ -n "$files" ]; then echo "pip configuration files in the image: $files"; exit 1; fi
extra=$(env | grep '^PIP_' | grep -Ev '^PIP_(NO_CACHE_DIR|DISABLE_PIP_VERSION_CHECK)=' || true)
if [ -n "$extra" ]; then echo "PIP_ variables the Dockerfile does not set: $extra"; exit 1; fi
echo "ok: no pip configuration of the host in the image"
