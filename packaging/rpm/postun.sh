systemctl daemon-reload >/dev/null 2>&1 || :
if [ "$1" -ge 1 ]; then
  # Upgrade: the agent restarts and re-adopts tasks; weft-tasks.service is left alone.
  systemctl try-restart weft-sidekick.service weft-agent.service weft-hcs.service weft-controlplane.service >/dev/null 2>&1 || :
fi
