systemd-sysusers weft.conf || :
systemd-tmpfiles --create weft.conf || :
# The control plane's key for jobs' secrets at rest (docs/security.md): made once
# when there is none, never overwritten. Replicas on etcd must share one key file:
# copy the first host's to the others before they start.
if [ ! -e /etc/weft/secrets.key ]; then
  key=$(od -An -vtx1 -N32 /dev/urandom | tr -d ' \n')
  (umask 077; set -C; printf 'k%s %s\n' "$(date +%Y%m)" "$key" >/etc/weft/secrets.key) 2>/dev/null || true
fi
systemctl daemon-reload >/dev/null 2>&1 || :
if [ "$1" -eq 1 ]; then
  systemctl enable weft-sidekick.service weft-tasks.service weft-agent.service weft-hcs.service >/dev/null 2>&1 || :
  systemctl start weft-sidekick.service weft-tasks.service weft-agent.service weft-hcs.service >/dev/null 2>&1 || :
fi
