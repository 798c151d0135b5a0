package wire

import (
	"encoding/json"
	"net/http"
)

// WriteJSONError answers code with {"error": msg}, as every JSON endpoint
// of ratelimitd answers an error.
func WriteJSONError(w http.ResponseWriter, code int, msg string) {
	body, _ := json.Marshal(struct {
		Error string `json:"error"`
	}{msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(body, '\n'))
}
