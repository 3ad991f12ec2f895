package verbs

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCompletionError(t *testing.T) {
	ok := WorkCompletion{ID: 7, Status: WCSuccess}
	require.NoError(t, ok.Err())

	wc := WorkCompletion{ID: 7, QPN: 0x11, Status: WCRetryExcErr, VendorErr: 0x81}
	err := wc.Err()
	var ce *CompletionError
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, wc, ce.WC)
	assert.Equal(t, "verbs: work request 7 on QP 0x11 completed with RETRY_EXC_ERR (vendor error 0x81): "+
		WCRetryExcErr.Hint(), err.Error(), "the status's own hint by default")

	ce.Hint = "the peer closed the connection"
	assert.Equal(t, "verbs: work request 7 on QP 0x11 completed with RETRY_EXC_ERR (vendor error 0x81): "+
		"the peer closed the connection", err.Error(), "a caller's hint replaces it")

	noHint := WorkCompletion{ID: 1, QPN: 2, Status: WCGeneralErr}
	assert.Equal(t, "verbs: work request 1 on QP 0x2 completed with GENERAL_ERR (vendor error 0x0)", noHint.Err().Error())
}
