systemd-sysusers weft.conf || :
systemd-tmpfiles --create weft.conf || :
systemctl daemon-reload >/dev/null 2>&1 || :
if [ "$1" -eq 1 ]; then
  systemctl enable weft-sidekick.service weft-tasks.service weft-agent.service weft-hcs.service >/dev/null 2>&1 || :
  systemctl start weft-sidekick.service weft-tasks.service weft-agent.service weft-hcs.service >/dev/null 2>&1 || :
fi
