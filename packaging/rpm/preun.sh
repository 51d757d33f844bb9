if [ "$1" -eq 0 ]; then
  systemctl disable --now weft-agent.service weft-tasks.service weft-sidekick.service weft-hcs.service weft-controlplane.service >/dev/null 2>&1 || :
fi
