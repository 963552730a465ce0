// Built inside a checkout of NVIDIA/dcgm-exporter by tools/dcgm-exporter/make-pod-label-fixture: prints, as JSON,
// what dcgm-exporter's own utils.SanitizeLabelName makes of each pod label key, and which keys each allowlist
// admits through Go's regexp MatchString, the call dcgm-exporter's pod mapper makes for
// --kubernetes-pod-label-allowlist-regex (any expression of the list finding the key admits it).
package main

import (
	"encoding/json"
	"os"
	"regexp"

	"github.com/NVIDIA/dcgm-exporter/internal/pkg/utils"
)

func main() {
	keys := []string{"app", "app.kubernetes.io/name", "team-a", "Tier_2", "example.com/owner", "myapp", "a.b",
		"a-b", "9lives", "gpu", "pod_uid"}
	allowlists := [][]string{{"app"}, {"^app$", "^tier$"}, {"^app\\.kubernetes\\.io/"}, {"[0-9]"}, {"^(a|b)\\.b$"}}
	names := map[string]string{}
	for _, key := range keys {
		names[key] = utils.SanitizeLabelName(key)
	}
	admitted := [][]string{}
	for _, patterns := range allowlists {
		found := []string{}
		for _, key := range keys {
			for _, pattern := range patterns {
				if regexp.MustCompile(pattern).MatchString(key) {
					found = append(found, key)
					break
				}
			}
		}
		admitted = append(admitted, found)
	}
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	encoder.Encode(map[string]interface{}{"names": names, "allowlists": allowlists, "admitted": admitted})
}
